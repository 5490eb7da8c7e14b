//! How gRPC messages that cannot be read are answered.
//!
//! tonic's own protobuf codec answers INTERNAL to a message that does not
//! decode; that is the sender's fault, so [`ProtoCodec`], the codec the
//! generated code uses (see `build.rs`), answers INVALID_ARGUMENT with a
//! message that says what to fix.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::ProstEncoder;

/// The protobuf codec of `idgen.v1`: prost encoding, and a decoder that
/// answers INVALID_ARGUMENT to bytes that are not the expected message.
#[derive(Debug, Clone, Copy)]
pub struct ProtoCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for ProtoCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for ProtoCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = RequestDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder(PhantomData)
    }
}

/// Decodes one protobuf message; undecodable bytes are INVALID_ARGUMENT.
#[derive(Debug, Clone, Copy)]
pub struct RequestDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for RequestDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|e| {
            let name = std::any::type_name::<U>().rsplit("::").next().unwrap_or("message");
            Status::invalid_argument(format!(
                "the request is not a valid idgen.v1.{name} protobuf message ({e}); check that the client was generated from idgen.proto"
            ))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}
