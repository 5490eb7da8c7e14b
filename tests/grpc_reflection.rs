//! gRPC server reflection answers both v1 and v1alpha (older grpcurl,
//! Python's grpcio-reflection, Postman and Evans speak only v1alpha).

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
    let mut v1 = ServerReflectionClient::new(channel);
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
    server.stop().await;
}
