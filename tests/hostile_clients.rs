//! Clients that send what no idgen client would: bytes that are not the
//! request message, requests far above the size limit, and HTTP answers a
//! caching proxy could serve twice. Each gets the right code and a message
//! that says what to fix; the node keeps serving everyone else.

mod common;

use bytes::BufMut;
use common::{test_config, TestServer};
use idgen::proto::{GenIdsRequest, GenIdsResponse};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Code;

/// Sends raw bytes as the request message, whatever they hold.
#[derive(Default)]
struct RawCodec;

struct RawEncoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

struct ResponseDecoder;

impl Decoder for ResponseDecoder {
    type Item = GenIdsResponse;
    type Error = tonic::Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<GenIdsResponse>, tonic::Status> {
        use prost::Message;
        GenIdsResponse::decode(buf)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = GenIdsResponse;
    type Encoder = RawEncoder;
    type Decoder = ResponseDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> ResponseDecoder {
        ResponseDecoder
    }
}

async fn raw_gen_ids(server: &TestServer, body: Vec<u8>) -> Result<GenIdsResponse, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel).max_encoding_message_size(64 << 20);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/idgen.v1.IdGen/GenIds");
    grpc.unary(tonic::Request::new(body), path, RawCodec)
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn undecodable_and_oversized_requests_are_the_callers_fault_and_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(test_config(dir.path())).await;

    // Field 3 (count) as a length-delimited field whose length runs past
    // the end: not a GenIdsRequest.
    let err = raw_gen_ids(&server, vec![0x1a, 0x7f, 0x01])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("not a valid idgen.v1.GenIdsRequest"),
        "{}",
        err.message()
    );

    // 5 MB: refused before it is read, naming the limit and its setting.
    let err = raw_gen_ids(&server, vec![0u8; 5 << 20]).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("5242880 bytes")
            && err
                .message()
                .contains("65536 bytes (server.max_request_size)"),
        "{}",
        err.message()
    );

    // A well-formed request on the same path still works.
    let good = prost::Message::encode_to_vec(&GenIdsRequest {
        count: 3,
        ..Default::default()
    });
    let ids = raw_gen_ids(&server, good).await.expect("GenIds").ids;
    assert_eq!(ids.len(), 3);
    server.stop().await;
}

#[tokio::test]
async fn http_answers_are_never_cached() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(test_config(dir.path())).await;
    for path in [
        "/v1/id",
        "/v1/ids?count=2",
        "/v1/ids?count=0",
        "/v1/decode?id=1",
        "/readyz",
    ] {
        let resp = reqwest::get(server.url(path)).await.unwrap();
        let cache = resp
            .headers()
            .get(reqwest::header::CACHE_CONTROL)
            .map(|v| v.to_str().unwrap_or("").to_owned());
        assert_eq!(cache.as_deref(), Some("no-store"), "{path}");
    }
    server.stop().await;
}
