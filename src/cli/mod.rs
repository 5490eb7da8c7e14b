//! The `idgen` command line, one file per subcommand: `args` declares
//! every flag (its `///` comments are the `--help` text); `serve`,
//! `check` (check-config), `init`, `state` (backup, restore), `decode`
//! work on a config or a state file; `gen`, `bench` and `admin` are
//! clients of a running node. `client` and `output` are what the clients
//! share: where to connect, how long to wait, how errors and output read.

pub mod admin;
pub mod admin_datacenters;
pub mod admin_formats;
pub mod admin_hide_keys;
pub mod args;
pub mod bench;
pub mod check;
pub mod client;
pub mod decode;
pub mod gen;
pub mod init;
pub mod output;
pub mod serve;
pub mod state;
pub mod tls;
