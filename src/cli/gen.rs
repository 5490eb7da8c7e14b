//! `idgen gen`: ask a running node for IDs.

use idgen::proto::{self, id_gen_client::IdGenClient};

use super::args::GenArgs;
use super::client::{call, channel, status_error};
use super::output::{self, outln};

/// Prints `--count` IDs, one per line or as JSON, fetched in calls of at
/// most `--batch` (or the server's own maximum, if lower).
pub async fn run(a: GenArgs) -> anyhow::Result<()> {
    let mode = idgen::id::Mode::parse(&a.mode)?;
    let mode = idgen::server::grpc::mode_to_proto(mode) as i32;
    let mut client = IdGenClient::new(channel(&a.addr, a.timeout).await?);
    let ids = if a.count == 1 {
        let request = proto::GenIdRequest { mode, tag: a.tag };
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
    if a.json {
        let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
        outln!("{}", serde_json::json!({ "ids": ids }))?;
    } else {
        let mut out = String::with_capacity(ids.len() * 20);
        for id in ids {
            out.push_str(&id.to_string());
            out.push('\n');
        }
        output::write(&out)?;
    }
    Ok(())
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
