//! `idgen gen`: ask a running node for IDs.

use idgen::proto::{self, id_gen_client::IdGenClient};

use super::args::{DiscoveryArgs, GenArgs};
use super::client::{call, channel, status_error};
use super::output::{self, outln};

/// Prints `--count` IDs, one per line or as JSON, fetched in calls of at
/// most `--batch` (or the server's own maximum, if lower).
pub async fn run(a: GenArgs) -> anyhow::Result<()> {
    if let Some(format) = &a.format {
        let ids = formatted(&a, format).await?;
        return print_strings(&a, ids);
    }
    let mode = idgen::id::Mode::parse(&a.mode)?;
    let mode = idgen::server::grpc::mode_to_proto(mode) as i32;
    if a.discovery.discover.is_some() {
        // IDs obtained before a failure are printed, then the error says
        // how many: they were issued, and dropping them would only waste
        // them (the contract stated in `idgen gen --help`).
        let (ids, failure) = from_cluster(&a, mode).await;
        let printed = ids.len();
        if failure.is_none() || printed > 0 {
            print(&a, ids)?;
        }
        return match failure {
            None => Ok(()),
            Some(e) if printed > 0 => Err(e.context(format!(
                "printed the {printed} of {} IDs obtained before this failure",
                a.count
            ))),
            Some(e) => Err(e),
        };
    }
    let ids = from_node(&a, mode).await?;
    print(&a, ids)
}

/// `--discover consul`: through the idgen-client crate, which spreads the
/// calls over the passing nodes and retries another node when one fails.
/// Returns the IDs obtained, and the error that stopped it early, if any.
async fn from_cluster(a: &GenArgs, mode: i32) -> (Vec<u64>, Option<anyhow::Error>) {
    let client = match discovered_client(&a.discovery, &a.tls, a.timeout).await {
        Ok(c) => c,
        Err(e) => return (Vec::new(), Some(e)),
    };
    let Ok(mode) = idgen_client::Mode::try_from(mode) else {
        return (
            Vec::new(),
            Some(anyhow::anyhow!("mode {mode} is not known to the client")),
        );
    };
    collect(a.count, a.batch, |count| {
        let client = client.clone();
        let tag = a.tag.clone();
        async move {
            if count == 1 {
                client.gen_id(mode, &tag).await.map(|id| vec![id])
            } else {
                client.gen_ids(mode, &tag, count).await
            }
        }
    })
    .await
}

/// Fetches `total` IDs in calls of at most `batch`; on a failure, keeps
/// what the calls before it returned.
async fn collect<F, Fut>(total: u32, batch: u32, mut fetch: F) -> (Vec<u64>, Option<anyhow::Error>)
where
    F: FnMut(u32) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<u64>, idgen_client::Error>>,
{
    let mut ids = Vec::with_capacity(total as usize);
    while ids.len() < total as usize {
        let count = (total - ids.len() as u32).min(batch);
        match fetch(count).await {
            Ok(got) => ids.extend(got),
            Err(e) => return (ids, Some(e.into())),
        }
    }
    (ids, None)
}

/// A client of the nodes Consul lists as passing for `--service`; the
/// token comes from CONSUL_HTTP_TOKEN and the HTTPS settings from
/// `--consul-ca` and the rest, or Consul's own variables (CONSUL_CACERT,
/// CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY, CONSUL_TLS_SERVER_NAME). With
/// `--ca` the nodes themselves are dialled over TLS.
pub(super) async fn discovered_client(
    d: &DiscoveryArgs,
    tls: &super::tls::TlsArgs,
    deadline: std::time::Duration,
) -> anyhow::Result<idgen_client::Client> {
    let mut discovery = idgen_client::ConsulDiscovery::new(&d.consul).service(&d.service);
    if let Ok(token) = std::env::var("CONSUL_HTTP_TOKEN") {
        discovery = discovery.token(token);
    }
    let https = d.consul.starts_with("https://");
    match (&d.consul_ca, https) {
        (Some(ca), true) => {
            let client = d.consul_cert.as_deref().zip(d.consul_key.as_deref());
            let tls = idgen_client::ConsulTls::from_files(
                ca,
                client,
                d.consul_tls_server_name.as_deref(),
            )
            .map_err(|e| anyhow::anyhow!("--consul-ca/--consul-cert/--consul-key: {e}"))?;
            discovery = discovery.tls(tls);
        }
        (None, true) => anyhow::bail!(
            "--consul {} is https:// and needs --consul-ca <file> (or CONSUL_CACERT): the CA (PEM) that signed the agent's certificate",
            d.consul
        ),
        (Some(_), false) => anyhow::bail!(
            "--consul-ca (or CONSUL_CACERT) is set but --consul {} is plaintext http://: use the agent's https:// address (port 8501 by default)",
            d.consul
        ),
        (None, false) => {}
    }
    // Each node gets a third of --timeout: one that stalls (stopped,
    // overloaded) leaves time to ask two others.
    let mut builder = idgen_client::Client::builder()
        .consul(discovery)
        .deadline(deadline)
        .attempt_timeout(deadline / 3);
    if let Some(tls) = tls.client_tls()? {
        builder = builder.tls(tls);
    }
    Ok(builder.build().await?)
}

/// One node at `--addr`.
async fn from_node(a: &GenArgs, mode: i32) -> anyhow::Result<Vec<u64>> {
    let mut client = IdGenClient::new(channel(&a.addr, a.timeout, &a.tls).await?);
    let ids = if a.count == 1 {
        let request = proto::GenIdRequest {
            mode,
            tag: a.tag.clone(),
        };
        vec![call(a.timeout, client.gen_id(request)).await?.id]
    } else {
        let mut ids = Vec::with_capacity(a.count as usize);
        let mut batch = a.batch;
        while ids.len() < a.count as usize {
            let count = (a.count - ids.len() as u32).min(batch);
            let request = proto::GenIdsRequest {
                mode,
                tag: a.tag.clone(),
                count,
            };
            match client.gen_ids(request).await {
                Ok(r) => ids.extend(r.into_inner().ids),
                // The server's server.max_batch is below --batch: it says
                // its maximum (and reserved nothing), so ask again in
                // calls of that size.
                Err(s) if server_max_batch(&s).is_some_and(|max| max < count) => {
                    batch = server_max_batch(&s).unwrap_or(1);
                }
                Err(s) => return Err(status_error(s)),
            }
        }
        ids
    };
    Ok(ids)
}

fn print(a: &GenArgs, ids: Vec<u64>) -> anyhow::Result<()> {
    print_strings(a, ids.iter().map(u64::to_string).collect())
}

fn print_strings(a: &GenArgs, ids: Vec<String>) -> anyhow::Result<()> {
    if a.json {
        outln!("{}", serde_json::json!({ "ids": ids }))?;
    } else {
        let mut out = String::with_capacity(ids.len() * 20);
        for id in ids {
            out.push_str(&id);
            out.push('\n');
        }
        output::write(&out)?;
    }
    Ok(())
}

/// `--format`: formatted IDs from the node at `--addr`, in calls of at
/// most `--batch`.
async fn formatted(a: &GenArgs, format: &str) -> anyhow::Result<Vec<String>> {
    let mut client = IdGenClient::new(channel(&a.addr, a.timeout, &a.tls).await?);
    let params: std::collections::HashMap<String, String> = a.param.iter().cloned().collect();
    let mut ids = Vec::with_capacity(a.count as usize);
    while ids.len() < a.count as usize {
        let count = (a.count - ids.len() as u32).min(a.batch);
        let request = proto::GenFormattedRequest {
            format: format.to_owned(),
            params: params.clone(),
            count,
        };
        ids.extend(call(a.timeout, client.gen_formatted(request)).await?.ids);
    }
    Ok(ids)
}

/// The largest batch a server accepts, from its INVALID_ARGUMENT answer
/// "count must be between 1 and N, ...".
fn server_max_batch(s: &tonic::Status) -> Option<u32> {
    if s.code() != tonic::Code::InvalidArgument {
        return None;
    }
    let rest = s.message().strip_prefix("count must be between 1 and ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok().filter(|max| *max > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failure_midway_keeps_the_ids_obtained_before_it() {
        let mut calls = 0;
        let (ids, failure) = collect(10, 3, |count| {
            calls += 1;
            let n = calls;
            async move {
                if n == 3 {
                    return Err(idgen_client::Error::Transport {
                        node: "10.0.0.1:50051".into(),
                        cause: "connection refused".into(),
                    });
                }
                Ok((0..u64::from(count))
                    .map(|i| u64::from(n as u32) * 100 + i)
                    .collect())
            }
        })
        .await;
        assert_eq!(ids, vec![100, 101, 102, 200, 201, 202]);
        let e = failure.expect("the third call failed");
        assert!(e.to_string().contains("10.0.0.1:50051"), "{e}");
        let (ids, failure) =
            collect(4, 3, |count| async move { Ok(vec![7; count as usize]) }).await;
        assert_eq!(ids.len(), 4);
        assert!(failure.is_none());
    }
}
