//! What the deployment files rely on: `IDGEN_CONFIG` names the config file
//! (the systemd unit and the Kubernetes manifests set it instead of
//! passing `--config`), systemd's `$STATE_DIRECTORY` moves the default
//! state file, while an explicit `store.path` still wins, and path keys
//! name `LoadCredential=` files as `${CREDENTIALS_DIRECTORY}/ID`.

mod common;

use common::{run_idgen_with_env, wait_for_status};

/// A config file that does not set `store.path`.
fn config_without_path(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("idgen.toml");
    std::fs::write(
        &path,
        "[server]\ngrpc_listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\nshutdown_grace = \"5s\"\n\
         [store]\ninit_if_missing = true\n\
         [log]\nformat = \"json\"\nlevel = \"info\"\n",
    )
    .unwrap();
    path
}

#[test]
fn idgen_config_names_the_file_and_state_directory_moves_the_default_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_without_path(dir.path());
    let state_dir = dir.path().join("state");
    std::fs::create_dir(&state_dir).unwrap();
    let (ok, out) = run_idgen_with_env(
        &["check-config"],
        &[
            ("IDGEN_CONFIG", config.to_str().unwrap()),
            ("STATE_DIRECTORY", state_dir.to_str().unwrap()),
        ],
    );
    assert!(ok, "{out}");
    // The file was read (its non-default grace), and the state file is in
    // $STATE_DIRECTORY.
    assert!(out.contains("shutdown_grace = \"5s\""), "{out}");
    let expected = state_dir.join("idgen.redb");
    assert!(
        out.contains(&format!("path = \"{}\"", expected.display())),
        "{out}"
    );

    // Without STATE_DIRECTORY: the absolute default.
    let (ok, out) = run_idgen_with_env(
        &["check-config"],
        &[("IDGEN_CONFIG", config.to_str().unwrap())],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("path = \"/var/lib/idgen/idgen.redb\""),
        "{out}"
    );

    // --config wins over IDGEN_CONFIG; store.path in the file wins over
    // STATE_DIRECTORY.
    let other = dir.path().join("other.toml");
    std::fs::write(&other, "[store]\npath = \"/srv/idgen/state.redb\"\n").unwrap();
    let (ok, out) = run_idgen_with_env(
        &["check-config", "--config", other.to_str().unwrap()],
        &[
            ("IDGEN_CONFIG", config.to_str().unwrap()),
            ("STATE_DIRECTORY", state_dir.to_str().unwrap()),
        ],
    );
    assert!(ok, "{out}");
    assert!(out.contains("path = \"/srv/idgen/state.redb\""), "{out}");
    assert!(!out.contains("shutdown_grace = \"5s\""), "{out}");
}

#[test]
fn bad_idgen_config_and_state_directory_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    let (ok, out) = run_idgen_with_env(
        &["check-config"],
        &[("IDGEN_CONFIG", missing.to_str().unwrap())],
    );
    assert!(!ok, "{out}");
    assert!(
        out.contains("nope.toml") && out.contains("does not exist"),
        "{out}"
    );

    let config = config_without_path(dir.path());
    let (ok, out) = run_idgen_with_env(
        &["check-config"],
        &[
            ("IDGEN_CONFIG", config.to_str().unwrap()),
            ("STATE_DIRECTORY", "relative/dir"),
        ],
    );
    assert!(!ok, "{out}");
    assert!(
        out.contains("STATE_DIRECTORY") && out.contains("absolute"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_keeps_its_state_in_state_directory() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_without_path(dir.path());
    let state_dir = dir.path().join("state");
    std::fs::create_dir(&state_dir).unwrap();
    // No --config: IDGEN_CONFIG names it, as in the systemd unit.
    let child = std::process::Command::new(common::idgen_bin())
        .arg("serve")
        .env("IDGEN_CONFIG", &config)
        .env("STATE_DIRECTORY", &state_dir)
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn idgen");
    let mut child = KillOnDrop(child);
    let stderr = child.0.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains("\"ready\"") {
                let _ = tx.send(line);
            }
        }
    });
    let ready = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("ready within 20 s");
    let v: serde_json::Value = serde_json::from_str(&ready).unwrap();
    let http = v["fields"]["http"].as_str().unwrap().to_string();
    assert!(wait_for_status(&format!("http://{http}/readyz"), 200).await);
    assert!(
        state_dir.join("idgen.redb").exists(),
        "the state file is in $STATE_DIRECTORY"
    );
}

/// Kills the child when the test ends, passed or failed.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The systemd unit's `LoadCredential=` IDs (active and commented out)
/// and the config lines its header tells to write.
fn unit_credentials() -> (Vec<String>, String) {
    let unit = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/systemd/idgen.service"),
    )
    .unwrap();
    let ids = unit
        .lines()
        .filter_map(|l| l.trim_start_matches('#').strip_prefix("LoadCredential="))
        .map(|v| v.split(':').next().unwrap().to_owned())
        .collect();
    let config = unit
        .lines()
        .filter_map(|l| l.strip_prefix("#   "))
        .filter(|l| l.starts_with('[') || l.contains("${CREDENTIALS_DIRECTORY}"))
        .map(|l| format!("{l}\n"))
        .collect();
    (ids, config)
}

/// Every credential the unit loads is named by the config lines it
/// documents (or, for the admin token, by its environment), and a node
/// started with those lines and `$CREDENTIALS_DIRECTORY` serves TLS from
/// the credential files; without the variable it refuses, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_systemd_credentials_are_the_files_the_config_names() {
    let (ids, documented) = unit_credentials();
    for id in [
        "tls-cert",
        "tls-key",
        "tls-client-ca",
        "consul-token",
        "hide-master-key",
    ] {
        assert!(
            ids.iter().any(|i| i == id),
            "LoadCredential={id}: missing in {ids:?}"
        );
    }
    for id in &ids {
        let named = documented.contains(&format!("${{CREDENTIALS_DIRECTORY}}/{id}\""))
            || id == "admin-token";
        assert!(
            named,
            "credential {id} is not named in the documented config:\n{documented}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    let (ok, out) = common::run_idgen(&["tls", "dev-certs", pki.to_str().unwrap()]);
    assert!(ok, "{out}");
    let creds = dir.path().join("credentials");
    std::fs::create_dir(&creds).unwrap();
    for (id, file) in [
        ("tls-cert", "node.pem"),
        ("tls-key", "node-key.pem"),
        ("tls-client-ca", "ca.pem"),
    ] {
        std::fs::copy(pki.join(file), creds.join(id)).unwrap();
    }
    // The [server.tls] lines as documented; the [consul] and [hide]
    // lines need a Consul backend and hidden IDs.
    let tls: String = documented
        .split_inclusive('\n')
        .skip_while(|l| !l.starts_with("[server.tls]"))
        .take_while(|l| !l.starts_with("[consul]"))
        .collect();
    assert_eq!(tls.lines().count(), 4, "{tls}");
    let config = common::write_child_config(dir.path(), true);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&tls);
    std::fs::write(&config, text).unwrap();

    let env = [("CREDENTIALS_DIRECTORY", creds.to_str().unwrap())];
    let node = common::ChildServer::try_start_env(&config, &[], &env).expect("serves");
    // It serves the credential certificate: a client trusting the CA gets
    // /readyz over TLS.
    let ca = common::tls::der_of(&pki.join("ca.pem"));
    let answer = common::tls::https_get(node.http, &ca, "/readyz").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(node);

    let refused = common::ChildServer::try_start_env(&config, &[], &[]);
    let log = refused.err().expect("no CREDENTIALS_DIRECTORY, no start");
    assert!(
        log.contains("server.tls.cert")
            && log.contains("CREDENTIALS_DIRECTORY is not set: run under systemd with LoadCredential= or give an absolute path"),
        "{log}"
    );
}
