//! How gRPC requests that cannot be read are answered.
//!
//! tonic's own protobuf codec answers INTERNAL to a request that does not
//! decode, and OUT_OF_RANGE to one above the size limit; both are the
//! caller's fault, so idgen answers INVALID_ARGUMENT and RESOURCE_EXHAUSTED,
//! with a message that says what to fix. [`ProtoCodec`] is the codec the
//! generated code uses (see `build.rs`); [`RequestSizeLayer`] rewrites the
//! size refusal, which tonic makes before any codec sees the bytes.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::codegen::http;
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

/// Answers requests above the size limit with RESOURCE_EXHAUSTED naming the
/// limit and its setting, instead of tonic's OUT_OF_RANGE.
#[derive(Debug, Clone, Copy)]
pub struct RequestSizeLayer {
    limit: usize,
}

impl RequestSizeLayer {
    /// For a server whose services refuse messages above `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self { limit }
    }
}

impl<S> tower::Layer<S> for RequestSizeLayer {
    type Service = RequestSize<S>;

    fn layer(&self, inner: S) -> RequestSize<S> {
        RequestSize {
            inner,
            limit: self.limit,
        }
    }
}

/// See [`RequestSizeLayer`].
#[derive(Debug, Clone)]
pub struct RequestSize<S> {
    inner: S,
    limit: usize,
}

impl<S, B, R> tower::Service<http::Request<B>> for RequestSize<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<R>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let limit = self.limit;
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            rewrite_too_large(response.headers_mut(), limit);
            Ok(response)
        })
    }
}

/// tonic's refusal of a message above the limit, as it words it.
const TONIC_TOO_LARGE: &str = "Error, decoded message length too large";

fn rewrite_too_large(headers: &mut http::HeaderMap, limit: usize) {
    if headers.get("grpc-status").map(http::HeaderValue::as_bytes) != Some(b"11") {
        return;
    }
    let Some(status) = Status::from_header_map(headers) else {
        return;
    };
    if !status.message().starts_with(TONIC_TOO_LARGE) {
        return;
    }
    let found = status
        .message()
        .split("found ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or("more than that");
    let fresh: http::Response<()> = Status::resource_exhausted(format!(
        "the request is {found} bytes, above this node's limit of {limit} bytes (server.max_request_size); send smaller requests"
    ))
    .into_http();
    for name in ["grpc-status", "grpc-message"] {
        match fresh.headers().get(name) {
            Some(value) => headers.insert(name, value.clone()),
            None => headers.remove(name),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tonics_size_refusal_is_rewritten() {
        let mut headers = Status::out_of_range(format!(
            "{TONIC_TOO_LARGE}: found 5242885 bytes, the limit is: 65536 bytes"
        ))
        .into_http::<()>()
        .headers()
        .clone();
        rewrite_too_large(&mut headers, 65_536);
        let status = Status::from_header_map(&headers).unwrap();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(
            status.message().contains("5242885 bytes")
                && status
                    .message()
                    .contains("65536 bytes (server.max_request_size)"),
            "{}",
            status.message()
        );
        let mut other = Status::out_of_range("something else")
            .into_http::<()>()
            .headers()
            .clone();
        rewrite_too_large(&mut other, 65_536);
        assert_eq!(
            Status::from_header_map(&other).unwrap().code(),
            tonic::Code::OutOfRange
        );
    }
}
