//! What the deployment files rely on: `IDGEN_CONFIG` names the config file
//! (the systemd unit and the Kubernetes manifests set it instead of
//! passing `--config`), and systemd's `$STATE_DIRECTORY` moves the default
//! state file, while an explicit `store.path` still wins.

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
