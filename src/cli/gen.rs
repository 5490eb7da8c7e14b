//! `idgen gen`: ask a running node for IDs, printing each batch as it
//! arrives.

use std::cell::Cell;
use std::fmt::Display;
use std::future::Future;

use idgen::proto::{self, id_gen_client::IdGenClient};

use super::args::{DiscoveryArgs, FormatCommand, GenArgs};
use super::client::{call, call_status, channel, status_error};
use super::output::{self, outln, IdStream, Interrupt, Interrupted};

/// Prints `--count` IDs, one per line or as JSON, fetched in calls of at
/// most `--batch` (or the server's own maximum, if lower). Each batch is
/// printed and flushed when it arrives, so a Ctrl-C or a failed call
/// keeps every ID printed so far, and the error says how many.
pub async fn run(a: GenArgs) -> anyhow::Result<()> {
    let mut out = IdStream::new(a.json);
    let result = take_all(&a, &mut out).await;
    end(a.count, out, result).map(drop)
}

/// Ends the output and tells what happened: the IDs a failure or a
/// Ctrl-C stopped short are counted, since each printed one was issued
/// and must not be lost to the user's view of the run.
fn end<W: std::io::Write>(
    count: u32,
    out: IdStream<W>,
    result: anyhow::Result<()>,
) -> anyhow::Result<W> {
    let printed = out.printed();
    let error = match result {
        Ok(()) => return Ok(out.finish()?),
        // The reader went away (`| head`): nothing more to say.
        Err(e) if output::is_broken_pipe(&e) => return Err(e),
        Err(e) => e,
    };
    // Close the JSON object over what was printed; a reader gone by now
    // is reported as such (a quiet exit).
    out.finish()?;
    if printed == 0 && !error.is::<Interrupted>() {
        return Err(error);
    }
    let when = if error.is::<Interrupted>() {
        "; the call in flight was abandoned"
    } else {
        " before this failure"
    };
    Err(error.context(format!("printed {printed} of {count} IDs{when}")))
}

/// Fetches the IDs from wherever `a` says, into `out`.
async fn take_all(a: &GenArgs, out: &mut IdStream) -> anyhow::Result<()> {
    if let Some(format) = &a.format {
        if a.discovery.discover.is_some() {
            // Plain calls (no prefetch: periods and rules decide each ID
            // when it is taken), spread over the passing nodes with
            // failover.
            let client = discovered_client(&a.discovery, &a.tls, a.timeout).await?;
            return stream(a, out, |count| {
                let client = client.clone();
                let params = a.param.clone();
                async move { Ok(client.gen_formatted(format, params, count).await?.ids) }
            })
            .await;
        }
        let client = IdGenClient::new(channel(&a.addr, a.timeout, &a.tls).await?);
        let params: std::collections::HashMap<String, String> = a.param.iter().cloned().collect();
        return stream(a, out, |count| {
            let mut client = client.clone();
            let request = proto::GenFormattedRequest {
                format: format.clone(),
                params: params.clone(),
                count,
            };
            async move { Ok(call(a.timeout, client.gen_formatted(request)).await?.ids) }
        })
        .await;
    }
    if a.uuid || a.ulid {
        return uuids(a, out).await;
    }
    let mode = idgen::id::Mode::parse(&a.mode)?;
    let mode = idgen::server::grpc::mode_to_proto(mode) as i32;
    if a.discovery.discover.is_some() {
        return from_cluster(a, mode, out).await;
    }
    from_node(a, mode, out).await
}

/// `--uuid`/`--ulid`: UUIDv7 from the node at `--addr`, or through the
/// client crate with `--discover` (any node: every node's UUIDs differ).
async fn uuids(a: &GenArgs, out: &mut IdStream) -> anyhow::Result<()> {
    let text = |bytes: &[u8]| -> anyhow::Result<String> {
        let uuid = idgen_client::Uuid::from_slice(bytes)
            .ok_or_else(|| anyhow::anyhow!("the node answered a UUID of {} bytes", bytes.len()))?;
        Ok(if a.ulid {
            uuid.to_ulid()
        } else {
            uuid.to_string()
        })
    };
    if a.discovery.discover.is_some() {
        let client = discovered_client(&a.discovery, &a.tls, a.timeout).await?;
        return stream(a, out, |count| {
            let client = client.clone();
            async move {
                let got = client.gen_uuids(count).await?;
                got.iter().map(|u| text(&u.0)).collect()
            }
        })
        .await;
    }
    let client = IdGenClient::new(channel(&a.addr, a.timeout, &a.tls).await?);
    stream(a, out, |count| {
        let mut client = client.clone();
        async move {
            let request = proto::GenUuidsRequest {
                count,
                with_text: false,
            };
            let r = call(a.timeout, client.gen_uuids(request)).await?;
            r.uuids.chunks(16).map(text).collect()
        }
    })
    .await
}

/// Asks `take` for at most `--batch` IDs at a time until `--count` are
/// printed, each batch written and flushed before the next call; a Ctrl-C
/// ends it with [`Interrupted`] between batches or during a call.
async fn stream<T, F, Fut>(a: &GenArgs, out: &mut IdStream, take: F) -> anyhow::Result<()>
where
    T: Display,
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = anyhow::Result<Vec<T>>>,
{
    stream_to(a.count, a.batch, out, take).await
}

/// [`stream`] of `total` IDs in calls of at most `batch` into any writer.
async fn stream_to<W, T, F, Fut>(
    total: u32,
    batch: u32,
    out: &mut IdStream<W>,
    mut take: F,
) -> anyhow::Result<()>
where
    W: std::io::Write,
    T: Display,
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = anyhow::Result<Vec<T>>>,
{
    let mut interrupt = Interrupt::new()?;
    let total = u64::from(total);
    while out.printed() < total {
        let count = u32::try_from((total - out.printed()).min(u64::from(batch)))?;
        let ids = tokio::select! {
            biased;
            () = interrupt.recv() => return Err(Interrupted.into()),
            taken = take(count) => taken?,
        };
        if ids.is_empty() {
            anyhow::bail!("the node answered a call for {count} IDs with none");
        }
        out.batch(&ids)?;
    }
    Ok(())
}

/// `--discover consul`: through the idgen-client crate, which spreads the
/// calls over the passing nodes and retries another node when one fails.
async fn from_cluster(a: &GenArgs, mode: i32, out: &mut IdStream) -> anyhow::Result<()> {
    let client = discovered_client(&a.discovery, &a.tls, a.timeout).await?;
    let Ok(mode) = idgen_client::Mode::try_from(mode) else {
        anyhow::bail!("mode {mode} is not known to the client");
    };
    stream(a, out, |count| {
        let client = client.clone();
        let tag = a.tag.clone();
        async move {
            Ok(if count == 1 {
                vec![client.gen_id(mode, &tag).await?]
            } else {
                client.gen_ids(mode, &tag, count).await?
            })
        }
    })
    .await
}

/// A client of the nodes Consul lists as passing for `--service`, set up
/// as the consul CLI would be: the flags, else Consul's own variables
/// (CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN/_FILE, CONSUL_CACERT,
/// CONSUL_CLIENT_CERT/_KEY, CONSUL_TLS_SERVER_NAME, CONSUL_HTTP_SSL_VERIFY;
/// one reading of them, `idgen_client::ConsulEnv`, shared with the client
/// crate), else the defaults. With `--ca` the nodes themselves are dialled
/// over TLS.
pub(super) async fn discovered_client(
    d: &DiscoveryArgs,
    tls: &super::args::TlsArgs,
    deadline: std::time::Duration,
) -> anyhow::Result<idgen_client::Client> {
    let discovery = consul_discovery(d, idgen_client::ConsulEnv::from_env())?;
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

/// The discovery settings of `d` over Consul's variables in `env`: each
/// flag given replaces its variable.
fn consul_discovery(
    d: &DiscoveryArgs,
    mut env: idgen_client::ConsulEnv,
) -> anyhow::Result<idgen_client::ConsulDiscovery> {
    if let Some(ca) = &d.consul_ca {
        env.cacert = Some(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&d.consul_cert, &d.consul_key) {
        env.client_cert = Some(cert.clone());
        env.client_key = Some(key.clone());
    }
    if let Some(name) = &d.consul_tls_server_name {
        env.tls_server_name = Some(name.clone());
    }
    let tls_flags = d.consul_ca.is_some() || d.consul_cert.is_some();
    let discovery = match &d.consul {
        Some(address) => {
            // A bare host:port is http://, as in Consul.
            let address = if address.contains("://") {
                address.clone()
            } else {
                format!("http://{address}")
            };
            idgen_client::ConsulDiscovery::new(address).env(env)
        }
        None => idgen_client::ConsulDiscovery::from_consul_env(env)
            .map_err(|e| anyhow::anyhow!("{e}"))?,
    };
    if tls_flags && !discovery.address.starts_with("https://") {
        anyhow::bail!(
            "--consul-ca/--consul-cert are set but the Consul address {} is plaintext http://: use the agent's https:// address (port 8501 by default)",
            discovery.address
        );
    }
    Ok(discovery
        .service(&d.service)
        .fallback_datacenters(d.fallback_datacenters.iter().cloned()))
}

/// One node at `--addr`. A server whose `server.max_batch` is below
/// `--batch` says its maximum (and reserves nothing): the calls continue
/// at that size.
async fn from_node(a: &GenArgs, mode: i32, out: &mut IdStream) -> anyhow::Result<()> {
    let client = IdGenClient::new(channel(&a.addr, a.timeout, &a.tls).await?);
    let most = Cell::new(a.batch);
    stream(a, out, |count| {
        let mut client = client.clone();
        let tag = a.tag.clone();
        let most = &most;
        async move {
            if a.count == 1 {
                let request = proto::GenIdRequest { mode, tag };
                return Ok(vec![call(a.timeout, client.gen_id(request)).await?.id]);
            }
            loop {
                let count = count.min(most.get());
                let request = proto::GenIdsRequest {
                    mode,
                    tag: tag.clone(),
                    count,
                };
                match call_status(a.timeout, client.gen_ids(request)).await? {
                    Ok(r) => return Ok(r.ids),
                    Err(s) if server_max_batch(&s).is_some_and(|max| max < count) => {
                        most.set(server_max_batch(&s).unwrap_or(1));
                    }
                    Err(s) => return Err(status_error(s)),
                }
            }
        }
    })
    .await
}

/// `idgen format parse|counter`: one call to the node at `--addr`, or to
/// the passing nodes with `--discover consul`.
pub async fn format_command(c: FormatCommand) -> anyhow::Result<()> {
    match c {
        FormatCommand::Parse {
            name,
            id,
            admin,
            node,
        } => {
            let token = super::admin::admin_token_from(
                admin.admin_token.as_deref(),
                admin.admin_token_file.as_deref(),
            )?;
            let request = proto::ParseFormattedRequest { format: name, id };
            let parsed = match (node.discovery.discover.is_some(), token) {
                (true, None) => {
                    let client =
                        discovered_client(&node.discovery, &node.tls, node.timeout).await?;
                    client.parse_formatted(&request.format, &request.id).await?
                }
                (true, Some(token)) => parse_on_a_node(request, &token, &node).await?,
                (false, token) => parse_on(&node.addr, request, token.as_deref(), &node).await?,
            };
            print_parsed(&parsed, node.json)
        }
        FormatCommand::Counter {
            name,
            param,
            admin,
            node,
        } => {
            let token = super::admin::admin_token_from(
                admin.admin_token.as_deref(),
                admin.admin_token_file.as_deref(),
            )?;
            let request = proto::GetFormatCounterRequest {
                format: name,
                params: param.into_iter().collect(),
            };
            if node.discovery.discover.is_some() {
                return counter_on_every_node(request, token.as_deref(), &node).await;
            }
            let counter = counter_on(&node.addr, request, token.as_deref(), &node).await?;
            if node.json {
                return Ok(outln!("{}", counter_json(&counter))?);
            }
            Ok(output::write(&counter_text(&counter))?)
        }
    }
}

/// ParseFormatted on the node at `addr`, with the admin token when given
/// (a hidden counter's internal value is then revealed).
async fn parse_on(
    addr: &str,
    request: proto::ParseFormattedRequest,
    token: Option<&str>,
    node: &super::args::FormatNodeArgs,
) -> anyhow::Result<proto::ParseFormattedResponse> {
    let mut client = IdGenClient::new(channel(addr, node.timeout, &node.tls).await?);
    let request = super::admin::with_bearer(tonic::Request::new(request), token)?;
    call(node.timeout, client.parse_formatted(request)).await
}

/// `format parse --discover` with an admin token: the client crate sends
/// no credentials, so the passing nodes are asked one at a time, by
/// address, until one answers.
async fn parse_on_a_node(
    request: proto::ParseFormattedRequest,
    token: &str,
    node: &super::args::FormatNodeArgs,
) -> anyhow::Result<proto::ParseFormattedResponse> {
    let mut failed = Vec::new();
    for addr in passing_nodes(node).await? {
        match parse_on(&addr, request.clone(), Some(token), node).await {
            Ok(parsed) => return Ok(parsed),
            Err(e) => failed.push(format!("{addr}: {e:#}")),
        }
    }
    anyhow::bail!("no passing node answered: {}", failed.join("; "))
}

/// The URLs of the passing nodes Consul lists, sorted; an error when none.
async fn passing_nodes(node: &super::args::FormatNodeArgs) -> anyhow::Result<Vec<String>> {
    let client = discovered_client(&node.discovery, &node.tls, node.timeout).await?;
    let mut addrs = client.nodes();
    addrs.sort();
    if addrs.is_empty() {
        anyhow::bail!("no passing node in Consul to ask; or ask one node with --addr");
    }
    let scheme = if node.tls.ca.is_some() {
        "https"
    } else {
        "http"
    };
    Ok(addrs
        .into_iter()
        .map(|a| format!("{scheme}://{a}"))
        .collect())
}

/// GetFormatCounter on the node at `addr`, with the admin token when
/// given (a hidden format's counter needs it).
async fn counter_on(
    addr: &str,
    request: proto::GetFormatCounterRequest,
    token: Option<&str>,
    node: &super::args::FormatNodeArgs,
) -> anyhow::Result<proto::GetFormatCounterResponse> {
    let mut client = IdGenClient::new(channel(addr, node.timeout, &node.tls).await?);
    let request = super::admin::with_bearer(tonic::Request::new(request), token)?;
    call(node.timeout, client.get_format_counter(request)).await
}

/// `format counter --discover`: a counter may belong to a node (`{node}`)
/// or to the token a node holds, so one arbitrary node's answer could be
/// another counter than the one a reader means, or an unused one. Every
/// passing node is asked and answers under its own address; the command
/// fails (after printing the others) if a node could not answer.
async fn counter_on_every_node(
    request: proto::GetFormatCounterRequest,
    token: Option<&str>,
    node: &super::args::FormatNodeArgs,
) -> anyhow::Result<()> {
    let urls = passing_nodes(node).await?;
    let mut answers = Vec::new();
    let mut failed = Vec::new();
    for url in &urls {
        // Answers are named by host:port, as Consul lists them.
        let addr = url
            .split_once("://")
            .map_or(url.as_str(), |(_, a)| a)
            .to_owned();
        match counter_on(url, request.clone(), token, node).await {
            Ok(counter) => answers.push((addr.clone(), counter)),
            Err(e) => failed.push(format!("{addr}: {e:#}")),
        }
    }
    if node.json {
        let nodes: Vec<serde_json::Value> = answers
            .iter()
            .map(|(addr, c)| {
                let mut v = counter_json(c);
                v["node"] = addr.clone().into();
                v
            })
            .collect();
        outln!("{}", serde_json::json!({ "nodes": nodes }))?;
    } else {
        let mut out = String::new();
        for (addr, counter) in &answers {
            out.push_str(&format!("node {addr}\n"));
            for line in counter_text(counter).lines() {
                out.push_str(&format!("  {line}\n"));
            }
        }
        output::write(&out)?;
    }
    if !failed.is_empty() {
        anyhow::bail!(
            "{} of {} nodes did not answer (a per-node counter is only on its node; ask it with --addr): {}",
            failed.len(),
            urls.len(),
            failed.join("; ")
        );
    }
    Ok(())
}

/// The fields a formatted ID carries, one `name value` per line.
fn print_parsed(p: &proto::ParseFormattedResponse, json: bool) -> anyhow::Result<()> {
    let mut fields = serde_json::Map::new();
    let mut put = |k: &str, v: Option<serde_json::Value>| {
        if let Some(v) = v {
            fields.insert(k.to_owned(), v);
        }
    };
    put("year", p.year.map(Into::into));
    put("month", p.month.map(Into::into));
    put("day", p.day.map(Into::into));
    put("hour", p.hour.map(Into::into));
    put("minute", p.minute.map(Into::into));
    put("second", p.second.map(Into::into));
    put("unix_seconds", p.unix_seconds.map(Into::into));
    put("node", p.node.map(Into::into));
    put("token", p.token.map(Into::into));
    put("seq", Some(p.seq.into()));
    put("check", p.check.clone().map(Into::into));
    // A hidden counter: its key version, and to an admin its internal value.
    put("key_version", p.key_version.map(Into::into));
    put("internal_seq", p.internal_seq.map(Into::into));
    let mut params: Vec<(&String, &String)> = p.params.iter().collect();
    params.sort();
    if json {
        let params: serde_json::Map<String, serde_json::Value> = params
            .into_iter()
            .map(|(k, v)| (k.clone(), v.clone().into()))
            .collect();
        fields.insert("params".into(), params.into());
        return Ok(outln!("{}", serde_json::Value::Object(fields))?);
    }
    let mut out = String::new();
    for (k, v) in &fields {
        let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
        out.push_str(&format!("{k} {v}\n"));
    }
    for (k, v) in params {
        out.push_str(&format!("param {k}={v}\n"));
    }
    Ok(output::write(&out)?)
}

/// A counter's record as JSON; the period's start and the next one's as
/// times.
fn counter_json(c: &proto::GetFormatCounterResponse) -> serde_json::Value {
    serde_json::json!({
        "used": c.used, "period": c.period, "period_start": period_start(c),
        "last": c.last, "next_period_start_ms": c.next_period_start_ms,
        "next_period_start": next_period_start(c), "token": c.token,
    })
}

/// When the next period starts, as a time; none for a format that never
/// resets.
fn next_period_start(c: &proto::GetFormatCounterResponse) -> Option<String> {
    (c.next_period_start_ms != 0)
        .then(|| jiff::Timestamp::from_millisecond(c.next_period_start_ms).ok())
        .flatten()
        .map(|t| t.to_string())
}

/// A counter's record, one `name value` per line.
fn counter_text(c: &proto::GetFormatCounterResponse) -> String {
    if !c.used {
        return "used false (the counter never issued an ID: it starts at the format's min)\n"
            .to_owned();
    }
    let mut out = format!(
        "used true\nperiod {}\nlast {}\n",
        period_start(c)
            .as_deref()
            .unwrap_or("the only one (the format never resets)"),
        c.last
    );
    if let Some(next) = next_period_start(c) {
        out.push_str(&format!("next period {next}\n"));
    }
    if !c.token.is_empty() {
        out.push_str(&format!("token {}\n", c.token));
    }
    out
}

/// The start of the counter's period: `period` is seconds of the format
/// zone's wall clock since 1970-01-01T00:00 (Unix seconds for zone UTC),
/// printed as that wall time; none for a format that never resets.
fn period_start(c: &proto::GetFormatCounterResponse) -> Option<String> {
    if !c.used || c.period == i64::MIN {
        return None;
    }
    let ts = jiff::Timestamp::from_second(c.period).ok()?;
    Some(format!(
        "starting {} (the format zone's wall time)",
        jiff::tz::Offset::UTC.to_datetime(ts)
    ))
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
    use std::path::Path;

    use super::*;

    fn args(consul: Option<&str>, ca: Option<&str>, name: Option<&str>) -> DiscoveryArgs {
        DiscoveryArgs {
            discover: Some("consul".into()),
            consul: consul.map(str::to_owned),
            service: "idgen".into(),
            consul_ca: ca.map(Into::into),
            consul_cert: None,
            consul_key: None,
            consul_tls_server_name: name.map(str::to_owned),
            fallback_datacenters: Vec::new(),
        }
    }

    #[test]
    fn flags_win_over_consuls_variables_which_win_over_the_defaults() {
        let env = idgen_client::ConsulEnv::from_vars([
            ("CONSUL_HTTP_ADDR", "https://10.0.0.1:8501"),
            ("CONSUL_CACERT", "/env/ca.pem"),
            ("CONSUL_TLS_SERVER_NAME", "env.name"),
            ("CONSUL_HTTP_TOKEN", "t"),
        ]);
        // No flags: the variables.
        let d = consul_discovery(&args(None, None, None), env.clone()).unwrap();
        assert_eq!(d.address, "https://10.0.0.1:8501");
        assert_eq!(d.env.cacert.as_deref(), Some(Path::new("/env/ca.pem")));
        assert_eq!(d.env.acl_token().unwrap().as_deref(), Some("t"));
        // Flags replace their variables; a bare host:port is http://.
        let flags = args(
            Some("https://c:8501"),
            Some("/flag/ca.pem"),
            Some("flag.name"),
        );
        let d = consul_discovery(&flags, env.clone()).unwrap();
        assert_eq!(d.address, "https://c:8501");
        assert_eq!(d.env.cacert.as_deref(), Some(Path::new("/flag/ca.pem")));
        assert_eq!(d.env.server_name().as_deref(), Some("flag.name"));
        let d = consul_discovery(&args(Some("c:8500"), None, None), env).unwrap();
        assert_eq!(d.address, "http://c:8500");
        // Nothing set: Consul's default.
        let none = idgen_client::ConsulEnv::default();
        let d = consul_discovery(&args(None, None, None), none.clone()).unwrap();
        assert_eq!(d.address, idgen_client::DEFAULT_CONSUL_ADDR);
        // A CA flag with a plaintext address says so.
        let e = consul_discovery(&args(Some("http://c:8500"), Some("/ca"), None), none)
            .unwrap_err()
            .to_string();
        assert!(e.contains("plaintext http://"), "{e}");
    }

    /// Batches are printed as they arrive: a call that fails midway leaves
    /// the IDs of the calls before it printed (JSON closed over them), and
    /// the error says how many.
    #[tokio::test]
    async fn a_failure_midway_keeps_the_ids_printed_before_it_and_counts_them() {
        for json in [false, true] {
            let mut out = IdStream::to(Vec::new(), json);
            let mut calls = 0;
            let result = stream_to(10, 3, &mut out, |count| {
                calls += 1;
                let n = calls;
                async move {
                    if n == 3 {
                        return Err(idgen_client::Error::Transport {
                            node: "10.0.0.1:50051".into(),
                            cause: "connection refused".into(),
                        }
                        .into());
                    }
                    Ok((0..u64::from(count))
                        .map(|i| u64::from(n as u32) * 100 + i)
                        .collect::<Vec<_>>())
                }
            })
            .await;
            let e = end(10, out, result).expect_err("the third call failed");
            let text = format!("{e:#}");
            assert!(
                text.contains("10.0.0.1:50051") && text.contains("printed 6 of 10 IDs"),
                "{text}"
            );
        }
        let mut out = IdStream::to(Vec::new(), false);
        let result = stream_to(4, 3, &mut out, |count| async move {
            Ok(vec![7; count as usize])
        })
        .await;
        let printed = end(4, out, result).expect("all four");
        assert_eq!(String::from_utf8_lossy(&printed), "7\n7\n7\n7\n");
        let mut out = IdStream::to(Vec::new(), true);
        let result = stream_to(2, 1, &mut out, |_| async move { Ok(vec![7]) }).await;
        let printed = end(2, out, result).expect("both");
        assert_eq!(
            String::from_utf8_lossy(&printed),
            "{\"ids\":[\"7\",\"7\"]}\n"
        );
    }
}
