//! The Python client (`clients/python`, PyPI name `idgen-client`) as a
//! user installs it: `scripts/setup.sh` builds its wheel and installs it
//! into a fresh virtualenv (`${TMPDIR:-/tmp}/idgen-client-venv`, or
//! `$IDGEN_CLIENT_PYTHON`); this runs the package's own test suite
//! (`clients/python/tests`, unittest) with that interpreter, against this
//! build's `idgen` and the Consul emulator's binary (`consul-testserver`
//! beside it, which `scripts/consul-interop.sh` builds first in
//! scripts/test.sh): discovery with Consul's variables, prefetch over
//! three nodes, failover past a node killed -9, strict keys routed and
//! never sent twice, formatted IDs, UUIDs, TLS and mTLS, asyncio, metrics
//! and the conformance driver.
//!
//! Without the virtualenv or the emulator's binary the test says what to
//! run and passes, unless `REQUIRE_PYTHON_EXAMPLE` is set (scripts/test.sh
//! sets it).

use std::path::PathBuf;
use std::process::Command;

/// The interpreter of the virtualenv the wheel was installed into.
fn python() -> PathBuf {
    match std::env::var_os("IDGEN_CLIENT_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => std::env::temp_dir().join("idgen-client-venv/bin/python"),
    }
}

#[test]
fn the_installed_python_client_passes_its_suite_against_real_nodes() {
    let python = python();
    let idgen = PathBuf::from(env!("CARGO_BIN_EXE_idgen"));
    let testserver = idgen.with_file_name("consul-testserver");
    let installed = Command::new(&python)
        .args(["-c", "import idgen_client"])
        .status()
        .is_ok_and(|s| s.success());
    if !installed || !testserver.exists() {
        let what = format!(
            "the Python client's suite needs {} with idgen_client installed (scripts/setup.sh) and {} (cargo build -p consul-testserver)",
            python.display(),
            testserver.display()
        );
        assert!(
            std::env::var_os("REQUIRE_PYTHON_EXAMPLE").is_none(),
            "REQUIRE_PYTHON_EXAMPLE is set: {what}"
        );
        eprintln!("not run: {what}");
        return;
    }
    let tests = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/python/tests");
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let mut command = Command::new(&python);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("CONSUL_") {
            command.env_remove(name);
        }
    }
    // From a scratch directory, so `import idgen_client` can only find the
    // installed package (the suite checks it comes from site-packages).
    let out = command
        .current_dir(scratch.path())
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(&tests)
        .env("TEST_IDGEN_BIN", &idgen)
        .env("TEST_CONSUL_TESTSERVER_BIN", &testserver)
        .env("GRPC_VERBOSITY", "NONE")
        .output()
        .expect("run the Python client's suite");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the Python client's suite failed:\n{text}"
    );
    assert!(text.contains("\nOK"), "{text}");
}
