//! The `idgen` client commands as a user meets them: closed pipes, servers
//! that are gone or silent, `host:port` addresses, batches above the
//! server's maximum, and one name for the admin token.

mod common;

use std::collections::HashSet;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use common::{idgen_bin, run_idgen, run_idgen_with_env, ChildServer};

/// A child config with a small `server.max_batch` and an admin token.
fn config(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("idgen.toml");
    let text = format!(
        "[server]\ngrpc_listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\nmax_batch = 100\n\
         [store]\npath = \"{}\"\ninit_if_missing = true\n\
         [admin]\ntoken = \"cli-test-token\"\n\
         [log]\nformat = \"json\"\n",
        dir.join("state.redb").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_closed_stdout_ends_the_command_quietly_with_status_zero() {
    // The reader (`true`) has exited before idgen writes: every write
    // meets a closed pipe, as with `idgen decode ID | head -1`.
    let script = format!(
        "{{ sleep 0.3; '{}' decode 382852853015773185; echo \"status=$?\" >&2; }} | true",
        idgen_bin().display()
    );
    let out = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .output()
        .expect("run sh");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("status=0"), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe"),
        "{err}"
    );
}

#[test]
fn gen_takes_host_port_and_splits_counts_above_the_servers_maximum() {
    let dir = tempfile::tempdir().unwrap();
    let node = ChildServer::start(&config(dir.path()));
    let addr = node.grpc.to_string();
    // --batch defaults to 10,000; the server allows 100 and says so, and
    // the command continues in calls of 100.
    let (ok, out) = run_idgen(&["gen", "--addr", &addr, "-n", "250"]);
    assert!(ok, "{out}");
    let ids: Vec<u64> = out.lines().map(|l| l.parse().expect(l)).collect();
    assert_eq!(ids.len(), 250);
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 250, "distinct");
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "increasing");
    let (ok, out) = run_idgen(&["gen", "--addr", &addr, "-n", "30", "--batch", "7", "--json"]);
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    assert_eq!(v["ids"].as_array().map(Vec::len), Some(30));
    let (ok, out) = run_idgen(&["gen", "--addr", &addr, "-n", "0"]);
    assert!(!ok, "{out}");
}

#[test]
fn a_stopped_or_silent_server_fails_within_the_timeout_naming_the_address() {
    let dir = tempfile::tempdir().unwrap();
    let node = ChildServer::start(&config(dir.path()));
    let addr = node.grpc.to_string();
    assert!(node.terminate().success());
    let (ok, out) = run_idgen(&["gen", "--addr", &addr]);
    assert!(!ok, "{out}");
    assert!(
        out.contains(&format!("cannot connect to http://{addr}"))
            && out.contains("idgen serve")
            && !out.contains("tcp connect error: tcp connect error"),
        "{out}"
    );
    // Accepts connections and never answers: bounded by --timeout (and
    // run_idgen fails the test if the command runs for 20 s).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    let holder = std::thread::spawn(move || {
        let mut held = Vec::new();
        silent.set_nonblocking(true).unwrap();
        for _ in 0..100 {
            if let Ok((conn, _)) = silent.accept() {
                held.push(conn);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    });
    for args in [
        vec!["gen", "--addr", &silent_addr, "--timeout", "1s"],
        vec![
            "admin",
            "--addr",
            &silent_addr,
            "--timeout",
            "1s",
            "--token",
            "x",
            "holders",
        ],
    ] {
        let (ok, out) = run_idgen(&args);
        assert!(!ok, "{out}");
        assert!(out.contains("DEADLINE_EXCEEDED"), "{args:?}: {out}");
    }
    let (ok, out) = run_idgen(&["gen", "--addr", "127.0.0.1"]);
    assert!(!ok && out.contains("no port"), "{out}");
    holder.join().unwrap();
}

#[test]
fn the_admin_token_has_one_variable_name_on_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let node = ChildServer::start(&config(dir.path()));
    let addr = node.grpc.to_string();
    let args = ["admin", "--addr", &addr, "holders"];
    let (ok, out) = run_idgen_with_env(&args, &[("IDGEN_ADMIN__TOKEN", "cli-test-token")]);
    assert!(ok, "{out}");
    assert!(!out.contains("deprecated"), "{out}");
    let (ok, out) = run_idgen_with_env(&args, &[("IDGEN_ADMIN_TOKEN", "cli-test-token")]);
    assert!(ok, "{out}");
    assert!(out.contains("IDGEN_ADMIN_TOKEN is deprecated"), "{out}");
    let (ok, out) = run_idgen(&args);
    assert!(!ok && out.contains("UNAUTHENTICATED"), "{out}");
}

/// With `IDGEN_ADMIN__TOKEN` exported (as the Admin API section says), a
/// token flag on the command line wins over it for every command that
/// takes one: `--token-file`/`--admin-token-file` are not refused as a
/// conflict with a `--token` nobody typed, and `--token` replaces the
/// variable; offline `decode` ignores it.
#[test]
fn a_token_flag_on_the_command_line_wins_over_the_exported_variable() {
    let dir = tempfile::tempdir().unwrap();
    let node = ChildServer::start(&config(dir.path()));
    let addr = node.grpc.to_string();
    let right = dir.path().join("right-token");
    std::fs::write(&right, "cli-test-token\n").unwrap();
    let right = right.to_string_lossy().into_owned();
    let wrong_env = [("IDGEN_ADMIN__TOKEN", "not-the-token")];
    let right_env = [("IDGEN_ADMIN__TOKEN", "cli-test-token")];
    let (ok, id) = run_idgen(&["gen", "--addr", &addr]);
    assert!(ok, "{id}");
    let id = id.trim();
    let parse = ["format", "parse", "no-such-format", "X1", "--addr", &addr];
    let mut parse_with_file = parse.to_vec();
    parse_with_file.extend(["--admin-token-file", &right]);
    for (args, env, succeeds) in [
        (
            vec!["admin", "--addr", &addr, "--token-file", &right, "holders"],
            &wrong_env,
            true,
        ),
        (
            vec!["admin", "--addr", &addr, "holders", "--token-file", &right],
            &wrong_env,
            true,
        ),
        (
            vec!["decode", id, "--addr", &addr, "--admin-token-file", &right],
            &wrong_env,
            true,
        ),
        (vec!["decode", id], &right_env, true),
        // No such format: the node's NOT_FOUND, not a refused command line.
        (parse_with_file, &wrong_env, false),
    ] {
        let (ok, out) = run_idgen_with_env(&args, env);
        assert!(
            !out.contains("cannot be used with") && !out.contains("required"),
            "{args:?}: {out}"
        );
        assert_eq!(ok, succeeds, "{args:?}: {out}");
        if !succeeds {
            assert!(out.contains("NOT_FOUND"), "{args:?}: {out}");
        }
    }
    let (ok, out) = run_idgen_with_env(
        &["admin", "--addr", &addr, "--token", "wrong", "holders"],
        &right_env,
    );
    assert!(
        !ok && out.contains("PERMISSION_DENIED"),
        "--token wins: {out}"
    );
}

/// Logs piped to a file or a collector carry no colour codes and no Rust
/// debug forms (`Some(..)`, `None`, long float tails), in text and JSON.
#[test]
fn piped_logs_are_plain_text_with_plain_field_values() {
    use std::io::{BufRead, BufReader};
    for format in ["text", "json"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idgen.toml");
        std::fs::write(
            &path,
            format!(
                "[server]\ngrpc_listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\n\
                 [store]\npath = \"{}\"\ninit_if_missing = true\n[log]\nformat = \"{format}\"\n",
                dir.path().join("state.redb").display()
            ),
        )
        .unwrap();
        let mut child = Command::new(idgen_bin())
            .args(["serve", "--config"])
            .arg(&path)
            .env_remove("RUST_LOG")
            .env_remove("NO_COLOR")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn idgen");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut lines = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !lines.iter().any(|l: &String| l.contains("idgen serving")) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => lines.push(line),
                Err(_) => break,
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        let text = lines.join("\n");
        assert!(text.contains("idgen serving"), "{format}: {text}");
        assert!(
            !text.contains('\u{1b}'),
            "{format}: ANSI codes in a pipe: {text}"
        );
        for debug_form in ["Some(", "None"] {
            assert!(
                !text.contains(debug_form),
                "{format}: {debug_form} in {text}"
            );
        }
        assert!(
            !has_long_fraction(&text),
            "{format}: unrounded float in {text}"
        );
        let serving = lines.iter().find(|l| l.contains("idgen serving")).unwrap();
        assert!(serving.contains("127.0.0.1:"), "{format}: {serving}");
    }
}

/// Whether a field value in `text` (`key=1.5` in text logs, `"key":1.5`
/// in JSON) is a number with more than four digits after its decimal
/// point, like an unrounded 30.397136000000003. Timestamps are not field
/// values and are left alone.
fn has_long_fraction(text: &str) -> bool {
    let b = text.as_bytes();
    (1..b.len()).any(|start| {
        let after_key = b[start - 1] == b'=' || (start >= 2 && &b[start - 2..start] == b"\":");
        if !after_key {
            return false;
        }
        let int = b[start..].iter().take_while(|c| c.is_ascii_digit()).count();
        let dot = start + int;
        int > 0
            && b.get(dot) == Some(&b'.')
            && b[dot + 1..]
                .iter()
                .take_while(|c| c.is_ascii_digit())
                .count()
                > 4
    })
}

/// 32 bytes, hex: the master key a hidden node seals its hide keys with.
const MASTER: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

/// `idgen decode ID --addr NODE` (docs/HIDING.md's way to decode a hidden ID)
/// against the real binary: a plain ID decodes as it does offline, with
/// and without the admin token; a hidden sortable ID gives the public view
/// without the token and, with it (flag, file or IDGEN_ADMIN__TOKEN), the
/// internal ID, whose fields are the ones the node printed; a wrong token
/// is refused, never answered with the public view.
#[test]
fn decode_with_addr_asks_the_node_plain_and_hidden_with_and_without_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let plain = ChildServer::start(&config(dir.path()));
    let addr = plain.grpc.to_string();
    let (ok, id) = run_idgen(&["gen", "--addr", &addr]);
    assert!(ok, "{id}");
    let id = id.trim();
    let (ok, offline) = run_idgen(&["decode", id]);
    assert!(ok, "{offline}");
    // The fields, without the note (stderr) naming the layout it assumed.
    let offline: String = offline
        .lines()
        .filter(|l| !l.starts_with("note: no --config given"))
        .map(|l| format!("{l}\n"))
        .collect();
    for token in [&[][..], &["--admin-token", "cli-test-token"][..]] {
        let mut args = vec!["decode", id, "--addr", &addr];
        args.extend_from_slice(token);
        let (ok, online) = run_idgen(&args);
        assert!(ok, "{args:?}: {online}");
        assert_eq!(
            online, offline,
            "{args:?}: the node's fields are the layout's"
        );
    }

    let hidden_dir = tempfile::tempdir().unwrap();
    let path = config(hidden_dir.path());
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("[layout]\nhide = \"sortable\"\nhide_key = \"ids\"\n");
    std::fs::write(&path, text).unwrap();
    let hidden = ChildServer::try_start_env(&path, &[], &[("IDGEN_HIDE_MASTER_KEY", MASTER)])
        .unwrap_or_else(|log| panic!("the hidden node did not start: {log}"));
    let addr = hidden.grpc.to_string();
    let token = ("IDGEN_ADMIN__TOKEN", "cli-test-token");
    let (ok, out) = run_idgen_with_env(
        &["admin", "--addr", &addr, "keys", "create", "ids"],
        &[token],
    );
    assert!(ok, "{out}");
    let (ok, id) = run_idgen(&["gen", "--addr", &addr]);
    assert!(ok, "{id}");
    let id = id.trim();

    let (ok, public) = run_idgen(&["decode", id, "--addr", &addr]);
    assert!(ok, "{public}");
    assert!(
        public.contains("hidden sortable") && public.contains("key version 0"),
        "{public}"
    );
    assert!(!public.contains("internal id"), "anonymous: {public}");

    let token_file = hidden_dir.path().join("admin-token");
    std::fs::write(&token_file, "cli-test-token\n").unwrap();
    let token_file = token_file.to_string_lossy().into_owned();
    let flag = vec![
        "decode",
        id,
        "--addr",
        &addr,
        "--admin-token",
        "cli-test-token",
    ];
    let file = vec![
        "decode",
        id,
        "--addr",
        &addr,
        "--admin-token-file",
        &token_file,
    ];
    let env = vec!["decode", id, "--addr", &addr];
    let mut revealed = Vec::new();
    for (args, env) in [(flag, None), (file, None), (env, Some(token))] {
        let (ok, out) = run_idgen_with_env(&args, env.as_slice());
        assert!(ok, "{args:?}: {out}");
        revealed.push(out);
    }
    assert!(revealed.iter().all(|r| *r == revealed[0]), "{revealed:?}");
    let admin = &revealed[0];
    let internal = admin
        .lines()
        .find_map(|l| l.strip_prefix("internal id "))
        .unwrap_or_else(|| panic!("no internal id in {admin}"));
    assert_ne!(internal, id, "the internal ID is not the shown one");
    // The internal fields: this node's worker and datacenter (0), and the
    // time the public view shows (sortable keeps it).
    let time = public
        .lines()
        .find(|l| l.starts_with("time "))
        .unwrap_or_else(|| panic!("no time in the sortable public view {public}"));
    for line in [time, "datacenter 0", "worker 0", "key version 0"] {
        assert!(admin.contains(line), "{line:?} not in {admin}");
    }
    let (ok, out) = run_idgen(&["decode", id, "--addr", &addr, "--admin-token", "wrong"]);
    assert!(!ok, "a wrong token is refused: {out}");
    assert!(!out.contains("hidden sortable"), "{out}");
}

/// `idgen gen --addr` at the node's HTTP port (with and without
/// `http://`) names it as the HTTP/1.1 port and the gRPC port to use,
/// instead of "UNKNOWN: transport error" or "CANCELLED: operation was
/// canceled".
#[test]
fn gen_at_the_http_port_says_it_is_the_http_port() {
    let dir = tempfile::tempdir().unwrap();
    let node = ChildServer::start(&config(dir.path()));
    let http = node.http.to_string();
    let url = format!("http://{http}");
    for args in [
        vec!["gen", "--addr", &http],
        vec!["gen", "--addr", &url, "-n", "5"],
    ] {
        let (ok, out) = run_idgen(&args);
        assert!(!ok, "{args:?}: {out}");
        assert!(
            out.contains("speaks HTTP/1.1, not gRPC") && out.contains("server.grpc_listen"),
            "{args:?}: {out}"
        );
    }
}

/// `idgen gen -n N` with stdout and stderr piped to the test; N is far
/// more than the test reads (the node's max_batch of 100 makes it 200,000
/// calls).
fn spawn_gen(addr: &str) -> Child {
    Command::new(idgen_bin())
        .args(["gen", "--addr", addr, "-n", "20000000"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn idgen gen")
}

/// The child's stdout, chunk by chunk, from a reader thread (closed at
/// EOF).
fn stdout_chunks(child: &mut Child) -> Receiver<Vec<u8>> {
    let mut stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    rx
}

/// Everything `rx` carries until its thread ends (bounded: 20 s).
fn drain(rx: &Receiver<Vec<u8>>, into: &mut Vec<u8>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(chunk) => into.extend(chunk),
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => panic!("stdout still open after 20 s"),
        }
    }
}

/// The child's exit status and stderr, waiting at most 20 s.
fn finish(mut child: Child) -> (std::process::ExitStatus, String) {
    for _ in 0..400 {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                e.read_to_string(&mut err).expect("stderr");
            }
            return (status, err);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("idgen gen still running 20 s after it was told to stop");
}

/// The first chunk of output, within 20 s: IDs are printed as they
/// arrive, not after the last call.
fn first_output(rx: &Receiver<Vec<u8>>) -> Vec<u8> {
    rx.recv_timeout(Duration::from_secs(20))
        .expect("no ID printed within 20 s: the IDs are not streamed")
}

/// Every line of `out` is a whole ID; returns how many.
fn whole_id_lines(out: &[u8]) -> usize {
    let text = String::from_utf8_lossy(out);
    assert!(
        text.ends_with('\n'),
        "a cut line: {:?}",
        &text[text.len().saturating_sub(40)..]
    );
    for line in text.lines() {
        line.parse::<u64>()
            .unwrap_or_else(|_| panic!("not a whole ID: {line:?}"));
    }
    text.lines().count()
}

/// The N of "printed N of M IDs" in `stderr`.
fn printed_count(stderr: &str) -> usize {
    let rest = stderr
        .split("printed ")
        .nth(1)
        .unwrap_or_else(|| panic!("no count of printed IDs in {stderr:?}"));
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|_| panic!("{stderr:?}"))
}

/// A reader that stops early (`idgen gen -n 20000000 | head`): the IDs
/// come as they are taken, and the closed pipe ends the command with
/// status 0 and nothing on stderr.
#[test]
fn gen_streams_its_ids_and_a_reader_that_stops_early_ends_it_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let node = ChildServer::start(&config(dir.path()));
    let mut child = spawn_gen(&node.grpc.to_string());
    let rx = stdout_chunks(&mut child);
    let first = first_output(&rx);
    assert!(String::from_utf8_lossy(&first).lines().count() > 0);
    // The reader goes away, as `head` does after its lines.
    drop(rx);
    let (status, err) = finish(child);
    assert!(status.success(), "{status}: {err}");
    assert!(err.is_empty(), "a closed pipe is not an error: {err}");
}

/// Ctrl-C during a long `idgen gen`: every line printed is a whole ID,
/// stderr says how many were printed and that is the number of lines, and
/// the status is 130 (ended by SIGINT).
#[test]
fn ctrl_c_during_gen_keeps_whole_lines_and_says_how_many_were_printed() {
    let dir = tempfile::tempdir().unwrap();
    let node = ChildServer::start(&config(dir.path()));
    let mut child = spawn_gen(&node.grpc.to_string());
    let rx = stdout_chunks(&mut child);
    let mut out = first_output(&rx);
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: kill(2) on the child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    drain(&rx, &mut out);
    let (status, err) = finish(child);
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted (SIGINT)"), "{err}");
    let lines = whole_id_lines(&out);
    assert_eq!(printed_count(&err), lines, "{err}");
}

/// The node shuts down during a long `idgen gen`: the IDs taken before
/// are printed whole, and the error says the node went away (shutting
/// down or restarting), what was tried and how many IDs were printed,
/// instead of "UNAVAILABLE: tcp connect error".
#[test]
fn a_node_that_shuts_down_mid_run_is_named_and_the_printed_ids_counted() {
    let dir = tempfile::tempdir().unwrap();
    let node = ChildServer::start(&config(dir.path()));
    let mut child = spawn_gen(&node.grpc.to_string());
    let rx = stdout_chunks(&mut child);
    let mut out = first_output(&rx);
    assert!(node.terminate().success());
    drain(&rx, &mut out);
    let (status, err) = finish(child);
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("went away during the run") && err.contains("1 attempt on 1 node"),
        "{err}"
    );
    let lines = whole_id_lines(&out);
    assert_eq!(printed_count(&err), lines, "{err}");
}

/// Offline `idgen decode` with no `--config` says which layout it decoded
/// under and names `--config`: a `js53` ID read under the default layout
/// gives plausible but wrong fields (issue 33: it printed them silently).
/// With the node's config it decodes under `js53`, with no note.
#[test]
fn offline_decode_without_a_config_names_the_layout_it_assumed() {
    let dir = tempfile::tempdir().unwrap();
    let js53 = dir.path().join("js53.toml");
    std::fs::write(&js53, "[layout]\npreset = \"js53\"\n").unwrap();
    let id = "12345678901";
    let (ok, out) = run_idgen_with_env(&["decode", id], &[]);
    assert!(ok, "{out}");
    for part in [
        "no --config given",
        "default layout",
        "js53",
        "--config FILE",
    ] {
        assert!(out.contains(part), "{part:?}: {out}");
    }
    let (ok, out) = run_idgen_with_env(
        &["decode", id, "--config", js53.to_str().unwrap(), "--json"],
        &[],
    );
    assert!(ok && !out.contains("no --config given"), "{out}");
}

/// `idgen check-config` warns about a master key file every user can
/// read, as `serve` does (the one check, `MasterKey::from_file`), and
/// prints the warning after the settings, beside the summary, where a
/// reader sees it (issue 33: it came first and scrolled away under the
/// settings).
#[cfg(unix)]
#[test]
fn check_config_warns_of_a_world_readable_master_key_after_the_settings() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("master.key");
    std::fs::write(&key, "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cfg = config(dir.path());
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!(
        "[hide]\nmaster_key_file = \"{}\"\n",
        key.display()
    ));
    std::fs::write(&cfg, text).unwrap();
    // One file for both streams, so the order is the order a terminal shows.
    let log = dir.path().join("out.txt");
    let file = std::fs::File::create(&log).unwrap();
    let status = Command::new(idgen_bin())
        .args(["check-config", "--config", cfg.to_str().unwrap()])
        .env_remove("IDGEN_HIDE_MASTER_KEY")
        .stdout(Stdio::from(file.try_clone().unwrap()))
        .stderr(Stdio::from(file))
        .status()
        .expect("run idgen");
    let out = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{out}");
    let warning = out
        .find("is readable by every user")
        .unwrap_or_else(|| panic!("no warning: {out}"));
    assert!(out.contains("chmod 600"), "{out}");
    let settings = out.find("[hide]").expect("the settings");
    let summary = out.find("config is valid").expect("the summary");
    assert!(
        settings < warning && warning < summary,
        "the warning comes after the settings, before the summary: {out}"
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (ok, out) = run_idgen(&["check-config", "--config", cfg.to_str().unwrap()]);
    assert!(ok && !out.contains("readable by every user"), "{out}");
}
