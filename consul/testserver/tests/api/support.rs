//! A minimal Consul HTTP client for the tests.

use std::time::{Duration, Instant};

use consul_testserver::{Config, TestConsul};
use serde_json::Value;

/// Settings that make expiry and reaping fast enough for tests.
pub fn fast_config() -> Config {
    Config {
        min_ttl: Duration::from_millis(100),
        min_deregister_critical_after: Duration::from_millis(100),
        check_reap_interval: Duration::from_millis(100),
        ..Config::default()
    }
}

pub async fn start() -> (TestConsul, Api) {
    start_with(fast_config()).await
}

pub async fn start_with(config: Config) -> (TestConsul, Api) {
    let consul = TestConsul::start(config)
        .await
        .unwrap_or_else(|e| panic!("start: {e}"));
    let api = Api::new(consul.addr());
    (consul, api)
}

/// One answer, with the headers the tests look at.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub index: u64,
    pub known_leader: Option<String>,
    pub last_contact: Option<String>,
    pub text: String,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.text))
    }
}

#[derive(Debug, Clone)]
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
    pub token: Option<String>,
}

impl Api {
    pub fn new(addr: std::net::SocketAddr) -> Self {
        Api {
            base: format!("http://{addr}/v1/"),
            http: client(Duration::from_secs(5)),
            token: None,
        }
    }

    pub fn with_token(&self, token: &str) -> Self {
        Api {
            token: Some(token.to_owned()),
            ..self.clone()
        }
    }

    pub async fn try_send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Vec<u8>,
    ) -> reqwest::Result<Resp> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .body(body);
        if let Some(token) = &self.token {
            request = request.header("X-Consul-Token", token);
        }
        let response = request.send().await?;
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let index = header("x-consul-index")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let known_leader = header("x-consul-knownleader");
        let last_contact = header("x-consul-lastcontact");
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok(Resp {
            status,
            index,
            known_leader,
            last_contact,
            text,
        })
    }

    pub async fn send(&self, method: reqwest::Method, path: &str, body: Vec<u8>) -> Resp {
        self.try_send(method, path, body)
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    pub async fn get(&self, path: &str) -> Resp {
        self.send(reqwest::Method::GET, path, Vec::new()).await
    }

    pub async fn put(&self, path: &str, body: impl Into<Vec<u8>>) -> Resp {
        self.send(reqwest::Method::PUT, path, body.into()).await
    }

    pub async fn put_json(&self, path: &str, body: Value) -> Resp {
        self.put(path, body.to_string()).await
    }

    pub async fn delete(&self, path: &str) -> Resp {
        self.send(reqwest::Method::DELETE, path, Vec::new()).await
    }

    /// Creates a session and returns its id.
    pub async fn session(&self, body: Value) -> String {
        let r = self.put_json("session/create", body).await;
        assert_eq!(r.status, 200, "{}", r.text);
        r.json()["ID"]
            .as_str()
            .unwrap_or_else(|| panic!("no ID in {}", r.text))
            .to_owned()
    }

    /// The single entry of a key.
    pub async fn entry(&self, key: &str) -> Value {
        let r = self.get(&format!("kv/{key}")).await;
        assert_eq!(r.status, 200, "{key}: {}", r.text);
        r.json()[0].clone()
    }
}

pub fn client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .unwrap_or_else(|e| panic!("client: {e}"))
}

/// Polls `check` every 20 ms until it holds or `limit` passes.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what}: not within {limit:?}");
}

pub fn b64(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}
