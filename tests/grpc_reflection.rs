//! gRPC server reflection answers both v1 and v1alpha (older grpcurl,
//! Python's grpcio-reflection, Postman and Evans speak only v1alpha), and
//! gives grpcurl what it needs to call `GenId` as the README shows.

mod common;

use common::{test_config, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_v1alpha_and_v1_both_list_the_idgen_service() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(test_config(dir.path())).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();

    use tonic_reflection::pb::v1alpha::{
        server_reflection_client::ServerReflectionClient as AlphaClient,
        server_reflection_request::MessageRequest as AlphaRequest,
        server_reflection_response::MessageResponse as AlphaResponse,
        ServerReflectionRequest as AlphaReq,
    };
    let mut alpha = AlphaClient::new(channel.clone());
    let mut answers = alpha
        .server_reflection_info(tokio_stream::iter([AlphaReq {
            host: String::new(),
            message_request: Some(AlphaRequest::ListServices(String::new())),
        }]))
        .await
        .expect("v1alpha reflection answers")
        .into_inner();
    let answer = answers.message().await.unwrap().expect("one answer");
    let Some(AlphaResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("not a service list: {answer:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(names.iter().any(|n| n == "idgen.v1.IdGen"), "{names:?}");

    use tonic_reflection::pb::v1::{
        server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        ServerReflectionRequest,
    };
    let mut v1 = ServerReflectionClient::new(channel.clone());
    let mut answers = v1
        .server_reflection_info(tokio_stream::iter([ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        }]))
        .await
        .expect("v1 reflection answers")
        .into_inner();
    let answer = answers.message().await.unwrap().expect("one answer");
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("not a service list: {answer:?}");
    };
    assert!(list.service.iter().any(|s| s.name == "idgen.v1.IdGen"));
    grpcurl_finds_and_calls_gen_id(&mut v1, channel).await;
    server.stop().await;
}

/// The README's `grpcurl -plaintext 127.0.0.1:50051 idgen.v1.IdGen/GenId`
/// without grpcurl (CI does not install it): what grpcurl does for it.
/// It asks reflection for the file that defines `idgen.v1.IdGen`, finds
/// `GenId` and its request type there, and sends an empty request (no
/// `-d`): the default mode, snowflake, answers with an ID.
async fn grpcurl_finds_and_calls_gen_id(
    reflection: &mut tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient<
        tonic::transport::Channel,
    >,
    channel: tonic::transport::Channel,
) {
    use tonic_reflection::pb::v1::{
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        ServerReflectionRequest,
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter([ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(
                "idgen.v1.IdGen".into(),
            )),
        }]))
        .await
        .expect("reflection answers")
        .into_inner();
    let answer = answers.message().await.unwrap().expect("one answer");
    let Some(MessageResponse::FileDescriptorResponse(files)) = answer.message_response else {
        panic!("no file descriptor for idgen.v1.IdGen: {answer:?}");
    };
    let defines = |what: &[u8]| {
        files
            .file_descriptor_proto
            .iter()
            .any(|file| file.windows(what.len()).any(|w| w == what))
    };
    assert!(
        defines(b"GenId") && defines(b"GenIdRequest") && defines(b"GenIdResponse"),
        "the descriptor grpcurl reads names GenId and its messages"
    );
    let id = idgen::proto::id_gen_client::IdGenClient::new(channel)
        .gen_id(idgen::proto::GenIdRequest::default())
        .await
        .expect("an empty GenId request is served")
        .into_inner()
        .id;
    assert!(id > 0, "a snowflake ID: {id}");
}
