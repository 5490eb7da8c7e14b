//! ACLs: 403 without a valid token, policies on KV, sessions, services,
//! and denials inside a transaction as 409.

use consul_testserver::{Config, Policy};
use serde_json::json;

use crate::support::{fast_config, start_with};

#[tokio::test]
async fn tokens_and_policies() {
    let config = Config {
        acl_master_token: Some("root".into()),
        ..fast_config()
    };
    let (consul, anonymous) = start_with(config).await;
    consul.add_token(
        "idgen",
        Policy {
            key_prefix_write: vec!["idgen/".into()],
            session_write: true,
            service_write: vec!["idgen".into()],
            ..Policy::default()
        },
    );
    let r = anonymous.put("kv/idgen/x", "v").await;
    assert_eq!((r.status, r.text.as_str()), (403, "Permission denied"));
    assert_eq!(
        anonymous.with_token("wrong").get("kv/idgen/x").await.status,
        403
    );
    assert!(consul.kv_get("idgen/x").is_none());

    let root = anonymous.with_token("root");
    assert_eq!(root.put("kv/other/x", "v").await.text, "true");

    let idgen = anonymous.with_token("idgen");
    assert_eq!(idgen.put("kv/idgen/x", "v").await.text, "true");
    assert_eq!(idgen.get("kv/idgen/x").await.status, 200);
    assert_eq!(idgen.put("kv/other/y", "v").await.status, 403);
    assert_eq!(idgen.get("kv/other/x").await.status, 403);
    let session = idgen.session(json!({})).await;
    assert!(!session.is_empty());

    // Authorization: Bearer works too.
    let r = idgen
        .http
        .put(format!("{}kv/idgen/bearer", idgen.base))
        .header("Authorization", "Bearer idgen")
        .body("b")
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status().as_u16(), 200);

    // Inside a transaction a denial is a 409 error at its operation.
    let ops = json!([
        {"KV": {"Verb": "set", "Key": "idgen/ok", "Value": "eA=="}},
        {"KV": {"Verb": "set", "Key": "other/no", "Value": "eA=="}},
    ]);
    let r = idgen.put_json("txn", ops).await;
    assert_eq!(r.status, 409, "{}", r.text);
    let errors = r.json()["Errors"].clone();
    assert_eq!(errors[0]["OpIndex"], 1);
    assert_eq!(errors[0]["What"], "Permission denied");
    assert!(consul.kv_get("idgen/ok").is_none());

    let svc = |name: &str| json!({"Name": name, "ID": name, "Port": 1});
    assert_eq!(
        idgen
            .put_json("agent/service/register", svc("idgen"))
            .await
            .status,
        200
    );
    assert_eq!(
        idgen
            .put_json("agent/service/register", svc("web"))
            .await
            .status,
        403
    );
    assert_eq!(consul.services().len(), 1);
}
