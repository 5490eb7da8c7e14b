//! Format definitions as durable, named objects, and the reload that turns
//! them into the table formatted mode serves.
//!
//! [`FormatCatalog`] owns the path from definitions to served formats:
//!
//! - **Where definitions live.** In the store ([`FormatCatalogStore`]): the
//!   admin API creates, updates and deletes them there, and a config
//!   file's `[[formats]]` entries are written there when a node starts or
//!   reloads with them ([`FormatCatalog::apply_config`]). The rule for a
//!   config entry: absent from the store, it is stored; equal to the stored
//!   definition, nothing happens; different, it is stored as an update
//!   when the update is allowed (the same check as `UpdateFormat`), and
//!   otherwise start-up or the reload is refused naming the format, the
//!   field and both definitions. A config entry for a deleted name is
//!   refused too.
//! - **What may change.** A format's rendering is frozen: every change
//!   (an update, a config entry, a reload finding another definition than
//!   the one served) goes through the one rule,
//!   [`FormatDef::check_update`]. Only the description may change, and
//!   `max` may grow; the Lua code, template, zone, reset, min, step and
//!   the rest are refused naming the field. A delete leaves a tombstone:
//!   the name is never used again.
//! - **Reload.** Every live stored definition is compiled into a new table
//!   ([`FormattedEngine::compile_table`], off the runtime; one served unchanged
//!   keeps its compiled format); only when all of them compiled and
//!   validated is it installed ([`FormattedEngine::install`]). A failure keeps the
//!   table in use and says which format failed and why. Reloads run after
//!   each admin change, on SIGHUP (re-reading the config file first), and
//!   in Consul when the stored definitions change (a blocking query on
//!   their folder, [`FormatCatalog::watch_consul`]), so a format created
//!   through one node is served by every node within moments; and before
//!   a call naming a format the node does not serve
//!   ([`FormatCatalog::reload_on_miss`]), so it is served from the first
//!   call. Counters
//!   live in the store, keyed by format name and scope, so they carry on
//!   across reloads.
//! - **Lua checks, once, off the lock.** A Lua rule's load-time checks
//!   (within `formatted.lua_check_budget`, see [`crate::id::format::lua`])
//!   run when its definition is created or first stored from the config
//!   file, and the record keeps their check key
//!   ([`StoredFormat::lua_checked`]): a reload or a restart loading a
//!   record whose key matches compiles the rule without them. Compiling
//!   happens before the `reloading` lock is taken; under it a reload only
//!   reads the definitions and installs formats already compiled
//!   (`commit`), so one slow rule never holds up another format's change
//!   or reload. An admin change installs the definition it compiled, not
//!   compiled again; a definition stored meanwhile by someone else waits
//!   for the reload its own write starts.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::error::Error;
use crate::id::format::FormatError;
use crate::id::format::{FormatDef, LoadChecks};
use crate::id::{Clock, ErrorKind};
use crate::metrics as m;
use crate::modes::formatted::{CompileFailure, CompiledFormats, FormattedEngine};
use crate::store::format::catalog::{
    DefChange, DefListing, DefSource, FormatCatalogStore, StoredFormat,
};
use crate::store::StoreError;

/// How long one blocking query for changed definitions waits before it
/// is asked again (Consul answers at once when something changed).
pub const WATCH_WAIT: Duration = Duration::from_secs(60);
/// The least time between two of those queries after one that found a
/// change.
pub const WATCH_GAP: Duration = Duration::from_millis(500);

/// The least time between two reloads calls naming an unknown format
/// start ([`FormatCatalog::reload_on_miss`]): a typo repeated by many
/// callers costs one store read per gap, not one per call, and each such
/// call waits at most this long for a reload that started after it came.
pub const MISS_RELOAD_GAP: Duration = Duration::from_secs(1);
/// The least time between two queries after one that woke without a
/// change to the definitions, or failed. Consul wakes a query on a folder
/// with no key (no format yet) at every KV write in the cluster, such as
/// each node's mark renewal: this keeps the watch at the cost of the poll
/// it replaced, never a busy loop.
pub const WATCH_QUIET_GAP: Duration = Duration::from_secs(2);

/// Reads the config file's `[[formats]]` again (SIGHUP); the error says
/// what is wrong with the file.
pub type ConfigSource = Arc<dyn Fn() -> Result<Vec<FormatDef>, String> + Send + Sync>;

/// Why a reload failed; the table in use stays.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{why}")]
pub struct ReloadError {
    /// The format that failed, when one did.
    pub format: Option<String>,
    /// What went wrong, naming the format.
    pub why: String,
    /// How to map it to a status.
    pub kind: ErrorKind,
}

impl ReloadError {
    fn new(format: Option<&str>, why: impl std::fmt::Display, kind: ErrorKind) -> Self {
        Self {
            format: format.map(str::to_owned),
            why: why.to_string(),
            kind,
        }
    }

    fn from_error(format: Option<&str>, e: &Error) -> Self {
        Self::new(format, e, e.kind())
    }
}

/// What a successful reload installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// Every format now served, sorted.
    pub formats: Vec<String>,
    /// Formats added, changed or removed by this reload, sorted.
    pub changed: Vec<String>,
}

/// Stored format definitions and the table served from them.
pub struct FormatCatalog {
    defs: Arc<dyn FormatCatalogStore>,
    formats: Arc<FormattedEngine>,
    clock: Arc<dyn Clock>,
    /// The config file's `[[formats]]`, as last read.
    config_defs: Mutex<Vec<FormatDef>>,
    /// Re-reads the config file on SIGHUP; `None`: keeps `config_defs`.
    config_source: Mutex<Option<ConfigSource>>,
    /// One install of a new table at a time ([`Self::commit`]): held
    /// while the stored definitions are read and the table built from
    /// formats already compiled, never across a compile.
    reloading: tokio::sync::Mutex<()>,
    /// The reloads of calls naming an unknown format.
    misses: super::miss::MissReloads,
}

/// The status kind of a definition refused at the admin API: a bad
/// argument, whatever the compiler calls it.
fn refused(e: impl Into<Error>) -> Error {
    let e = e.into();
    match e.kind() {
        ErrorKind::BadRequest => e,
        _ => StoreError::Format(FormatError::Invalid(e.to_string())).into(),
    }
}

impl FormatCatalog {
    /// A catalog over `defs` serving into `formats`; `config` is the
    /// config file's `[[formats]]` (applied by [`start`](Self::start)).
    pub fn new(
        defs: Arc<dyn FormatCatalogStore>,
        formats: Arc<FormattedEngine>,
        clock: Arc<dyn Clock>,
        config: Vec<FormatDef>,
    ) -> Self {
        Self {
            defs,
            formats,
            clock,
            config_defs: Mutex::new(config),
            config_source: Mutex::new(None),
            reloading: tokio::sync::Mutex::new(()),
            misses: super::miss::MissReloads::new(MISS_RELOAD_GAP),
        }
    }

    /// A call named a format this node does not serve: another node may
    /// have just defined it, and the watch would learn of it only within
    /// about a second. Returns once a reload that started after the call
    /// came has ended, so a format created anywhere before the call is
    /// served by it. Such reloads start at most once per
    /// [`MISS_RELOAD_GAP`]: a call inside the gap waits for the reload at
    /// its end (at most the gap), which every call waiting meanwhile
    /// shares.
    pub async fn reload_on_miss(&self) {
        self.misses
            .reload_for(|| async {
                log_reload("unknown format", self.reload("unknown format").await);
            })
            .await;
    }

    /// Where SIGHUP re-reads the config file's `[[formats]]` from.
    pub fn set_config_source(&self, source: ConfigSource) {
        *self
            .config_source
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(source);
    }

    /// The engine served from.
    pub fn formats(&self) -> &Arc<FormattedEngine> {
        &self.formats
    }

    /// The stored definitions.
    pub fn store(&self) -> &Arc<dyn FormatCatalogStore> {
        &self.defs
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_millis()
    }

    /// Start-up: the config file's entries into the store, then the first
    /// table. Any failure stops the start.
    pub async fn start(&self) -> Result<Reloaded, ReloadError> {
        let config = self.config_defs();
        let result = match self.apply_config(&config).await {
            Ok(prepared) => self.reload_with(prepared).await,
            Err(e) => Err(e),
        };
        count("start", &result);
        result
    }

    /// Reload for `trigger` (`admin`, `watch`): the stored definitions,
    /// compiled and installed if all of them compile.
    pub async fn reload(&self, trigger: &'static str) -> Result<Reloaded, ReloadError> {
        let result = self.reload_with(CompiledFormats::new()).await;
        count(trigger, &result);
        result
    }

    /// SIGHUP: the config file read again (when it can be), its entries
    /// applied to the store, then a reload.
    pub async fn reload_config(&self, trigger: &'static str) -> Result<Reloaded, ReloadError> {
        let result = self.reload_config_now().await;
        count(trigger, &result);
        result
    }

    async fn reload_config_now(&self) -> Result<Reloaded, ReloadError> {
        let source = self
            .config_source
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let config = match source {
            // Off the runtime: validating the file compiles its Lua rules.
            Some(read) => super::formatted::off_runtime(move || read())
                .await
                .and_then(|read| read)
                .map_err(|why| {
                    ReloadError::new(
                        None,
                        format!("the config file cannot be read again: {why}"),
                        ErrorKind::BadRequest,
                    )
                })?,
            None => self.config_defs(),
        };
        let prepared = self.apply_config(&config).await?;
        *self
            .config_defs
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = config;
        self.reload_with(prepared).await
    }

    fn config_defs(&self) -> Vec<FormatDef> {
        self.config_defs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Writes the config file's entries to the store (see the module doc);
    /// returns those it compiled (a new entry's Lua rule is checked here,
    /// once: the config file was read without its checks), for the reload
    /// that follows to serve.
    pub async fn apply_config(&self, config: &[FormatDef]) -> Result<CompiledFormats, ReloadError> {
        let mut prepared = CompiledFormats::new();
        for (i, def) in config.iter().enumerate() {
            let name = def.name.as_str();
            let entry = format!("the config file's [[formats]] entry {} ({name:?})", i + 1);
            let fail = |e: &Error| ReloadError::from_error(Some(name), e);
            let stored = self.defs.get(name).await.map_err(|e| fail(&e.into()))?;
            let Some(stored) = stored else {
                let compiled = self
                    .compile_one(def.clone(), LoadChecks::Run)
                    .await
                    .map_err(|f| {
                        ReloadError::new(Some(name), format!("{entry}: {}", f.1), f.1.kind())
                    })?;
                prepared.extend(compiled);
                let record = self.record(def.clone(), DefSource::Config);
                self.defs
                    .create(&record)
                    .await
                    .map_err(|e| fail(&e.into()))?;
                tracing::info!(format = name, "format stored from the config file");
                continue;
            };
            if stored.deleted {
                let e: Error = StoreError::Format(FormatError::Deleted {
                    format: name.to_owned(),
                    deleted_ms: stored.updated_ms,
                })
                .into();
                return Err(ReloadError::new(
                    Some(name),
                    format!("{entry}: {e}; remove the entry from the config file"),
                    ErrorKind::Precondition,
                ));
            }
            let wanted = inherit_origin(def.clone(), &stored.def);
            if wanted == stored.def {
                continue;
            }
            let (_, compiled) = self
                .update_stored(&wanted, DefSource::Config)
                .await
                .map_err(|e| {
                    ReloadError::new(
                        Some(name),
                        format!(
                            "{entry} differs from the stored definition and cannot replace it: {e}. Stored: {}; config file: {}. Make the entry match the stored definition (`idgen admin formats get {name}`), or use a new name",
                            def_json(&stored.def),
                            def_json(&wanted)
                        ),
                        e.kind(),
                    )
                })?;
            prepared.extend(compiled);
            tracing::info!(format = name, "format updated from the config file");
        }
        Ok(prepared)
    }

    /// A new record of `def`, stamped as having passed its Lua rule's
    /// checks: call only once they did.
    fn record(&self, def: FormatDef, source: DefSource) -> StoredFormat {
        let now = self.now_ms();
        StoredFormat {
            lua_checked: def.lua_check_key(self.formats.lua_limits()),
            def,
            deleted: false,
            source,
            created_ms: now,
            updated_ms: now,
            fresh: false,
        }
    }

    /// Whether loading `def` runs its Lua rule's checks: not when the
    /// record says it passed them under the key it has now (`stamp`).
    fn checks_for(&self, def: &FormatDef, stamp: Option<&str>) -> LoadChecks {
        match (def.lua_check_key(self.formats.lua_limits()), stamp) {
            (Some(key), Some(stamp)) if key == stamp => LoadChecks::Skip,
            _ => LoadChecks::Run,
        }
    }

    /// The stored definitions, or why they cannot all be read.
    async fn listing(&self) -> Result<DefListing, ReloadError> {
        let listing = self
            .defs
            .list()
            .await
            .map_err(|e| ReloadError::from_error(None, &e.into()))?;
        if let Some((key, why)) = listing.unreadable.first() {
            return Err(ReloadError::new(
                None,
                format!("stored format definition {key} is unreadable: {why}"),
                ErrorKind::Unavailable,
            ));
        }
        Ok(listing)
    }

    /// A reload: every live stored definition that neither the table
    /// served nor `prepared` has as stored is compiled, off the lock (a
    /// Lua rule's checks, when its record does not say they passed, can
    /// take up to `formatted.lua_check_budget`), then the whole is
    /// committed ([`commit`](Self::commit)).
    async fn reload_with(&self, mut prepared: CompiledFormats) -> Result<Reloaded, ReloadError> {
        let listing = self.listing().await?;
        let served = self.formats.table();
        let compiled_as_stored = |table: &CompiledFormats, def: &FormatDef| {
            table.get(&def.name).is_some_and(|f| f.def() == def)
        };
        let fresh: Vec<(FormatDef, LoadChecks)> = listing
            .live()
            .filter(|r| {
                !compiled_as_stored(&served, &r.def) && !compiled_as_stored(&prepared, &r.def)
            })
            .map(|r| {
                (
                    r.def.clone(),
                    self.checks_for(&r.def, r.lua_checked.as_deref()),
                )
            })
            .collect();
        let compiled = self
            .formats
            .compile_table(fresh)
            .await
            .map_err(|f| ReloadError::from_error(Some(&f.0), &f.1))?;
        prepared.extend(compiled);
        self.commit(&prepared).await
    }

    /// Installs the live stored definitions, read under the `reloading`
    /// lock, each as served now or as compiled in `prepared`; no Lua runs
    /// under the lock. One stored after `prepared` was compiled (by a
    /// concurrent change or another node) is left as served, or out if
    /// new: the reload that its write starts serves it.
    async fn commit(&self, prepared: &CompiledFormats) -> Result<Reloaded, ReloadError> {
        let _one = self.reloading.lock().await;
        let listing = self.listing().await?;
        let old = self.formats.table();
        let mut table = CompiledFormats::new();
        let mut pending = Vec::new();
        for def in listing.live().map(|r| &r.def) {
            let compiled = [old.get(&def.name), prepared.get(&def.name)]
                .into_iter()
                .flatten()
                .find(|f| f.def() == def)
                .or_else(|| {
                    pending.push(def.name.clone());
                    old.get(&def.name)
                });
            if let Some(f) = compiled {
                table.insert(def.name.clone(), Arc::clone(f));
            }
        }
        if !pending.is_empty() {
            tracing::debug!(
                formats = ?pending,
                "stored formats not compiled by this reload; the reload after their change serves them"
            );
        }
        for (name, new) in &table {
            if let Some(old) = old.get(name) {
                old.def().check_update(new.def()).map_err(|e| {
                    ReloadError::from_error(Some(name), &StoreError::from(e).into())
                })?;
            }
        }
        let mut changed: Vec<String> = table
            .iter()
            .filter(|(n, f)| old.get(*n).is_none_or(|o| o.def() != f.def()))
            .map(|(n, _)| n.clone())
            .chain(old.keys().filter(|n| !table.contains_key(*n)).cloned())
            .collect();
        changed.sort();
        let mut formats: Vec<String> = table.keys().cloned().collect();
        formats.sort();
        metrics::gauge!(m::FORMATS_SERVED).set(formats.len() as f64);
        self.formats.install(table);
        Ok(Reloaded { formats, changed })
    }

    /// Compiles `def` on a thread of its own, its Lua rule's checks run
    /// or skipped as `checks` says: they render up to about 110,000 IDs,
    /// which must not hold a worker of the runtime that serves requests,
    /// nor the process exit, nor (called before the lock is taken) any
    /// other change or reload.
    async fn compile_one(
        &self,
        def: FormatDef,
        checks: LoadChecks,
    ) -> Result<CompiledFormats, CompileFailure> {
        self.formats.compile_table(vec![(def, checks)]).await
    }

    /// `CreateFormat`: checked, stamped with its origin year, compiled on
    /// this node, stored, then served here at once (other Consul nodes
    /// as soon as their watch wakes, [`FormatCatalog::watch_consul`]).
    ///
    /// `fresh`: the operator asserts the name never issued an ID on this
    /// cluster before, so a restored state file does not floor it (see
    /// [`crate::store::format::restore`]).
    pub async fn create(
        &self,
        def: FormatDef,
        fresh: bool,
    ) -> Result<(StoredFormat, Reloaded), Error> {
        let def = def
            .stamped(self.now_ms() as i64)
            .map_err(|e| refused(StoreError::from(e)))?;
        let prepared = self
            .compile_one(def.clone(), LoadChecks::Run)
            .await
            .map_err(|f| refused(f.1))?;
        let record = StoredFormat {
            fresh,
            ..self.record(def, DefSource::Admin)
        };
        let written = self.defs.create(&record).await?;
        tracing::info!(format = written.def.name, fresh, "format created");
        Ok((written, self.commit_after_change(&prepared).await))
    }

    /// `UpdateFormat`: refused unless [`FormatDef::check_update`] allows
    /// it (the error names the field).
    pub async fn update(&self, def: FormatDef) -> Result<(StoredFormat, Reloaded), Error> {
        let (written, prepared) = self.update_stored(&def, DefSource::Admin).await?;
        tracing::info!(format = written.def.name, "format updated");
        Ok((written, self.commit_after_change(&prepared).await))
    }

    /// `DeleteFormat`: a tombstone; the name is never used again.
    pub async fn delete(&self, name: &str) -> Result<(StoredFormat, Reloaded), Error> {
        crate::id::format::check_name(name).map_err(|e| refused(StoreError::from(e)))?;
        let now = self.now_ms();
        let change: DefChange = Arc::new(move |r: &StoredFormat| {
            Ok(StoredFormat {
                deleted: true,
                source: DefSource::Admin,
                updated_ms: now,
                ..r.clone()
            })
        });
        let written = self.defs.change(name, change).await?;
        tracing::warn!(
            format = name,
            "format deleted (tombstone: the name is never used again)"
        );
        Ok((
            written,
            self.commit_after_change(&CompiledFormats::new()).await,
        ))
    }

    /// The reload after an admin change: the table as stored, with the
    /// changed definition as the change compiled it (`prepared`: compiled
    /// once per change, never again under the lock). The change is stored
    /// whatever this says, so a failure is reported, not returned as the
    /// call's error.
    async fn commit_after_change(&self, prepared: &CompiledFormats) -> Reloaded {
        let result = self.commit(prepared).await;
        count("admin", &result);
        result.unwrap_or_else(|e| Reloaded {
            formats: self.formats.names(),
            changed: vec![format!("(reload failed: {e})")],
        })
    }

    /// Replaces the stored live definition of `def.name` by `def`, checked
    /// against what is stored (in the store's compare-and-set); returns
    /// what was written and the new definition compiled.
    async fn update_stored(
        &self,
        def: &FormatDef,
        source: DefSource,
    ) -> Result<(StoredFormat, CompiledFormats), Error> {
        crate::id::format::check_name(&def.name).map_err(|e| refused(StoreError::from(e)))?;
        // Checked against what is stored before the new definition is
        // compiled (new Lua code is never run for a refused update), and
        // again in the compare-and-set below.
        let (mut compiled_def, mut checks) = (def.clone(), LoadChecks::Run);
        if let Some(stored) = self.defs.get(&def.name).await? {
            if !stored.deleted {
                compiled_def = inherit_origin(def.clone(), &stored.def);
                stored
                    .def
                    .check_update(&compiled_def)
                    .map_err(|e| refused(StoreError::from(e)))?;
                // A Lua rule cannot change (check_update), so its checks
                // passed already unless the record predates its key.
                checks = self.checks_for(&compiled_def, stored.lua_checked.as_deref());
            }
        }
        // Compiled here too, so a broken rule is refused before any write.
        let prepared = self
            .compile_one(compiled_def, checks)
            .await
            .map_err(|f| refused(f.1))?;
        // The key of checks that passed: the compare-and-set below keeps
        // the rule, zone, length and step (check_update), so it is the
        // written definition's too.
        let lua_checked = def.lua_check_key(self.formats.lua_limits());
        let (new, now) = (def.clone(), self.now_ms());
        let change: DefChange = Arc::new(move |r: &StoredFormat| {
            let new = inherit_origin(new.clone(), &r.def);
            r.def.check_update(&new).map_err(StoreError::from)?;
            Ok(StoredFormat {
                def: new,
                deleted: false,
                source,
                created_ms: r.created_ms,
                updated_ms: now,
                fresh: r.fresh,
                lua_checked: lua_checked.clone(),
            })
        });
        let written = self.defs.change(&def.name, change).await?;
        Ok((written, prepared))
    }

    /// Watches the Consul definitions for changes made through other nodes
    /// and reloads when they change: a blocking query on their folder
    /// (Consul answers when its index moves, or after [`WATCH_WAIT`]),
    /// asked again after [`WATCH_GAP`], or [`WATCH_QUIET_GAP`] when it
    /// woke without a change or failed. Follows Consul's rules for the
    /// index: the next query waits on the `X-Consul-Index` returned, and
    /// starts over from 0 (no blocking) when that went backwards, as after
    /// a snapshot restore. Runs until aborted.
    pub async fn watch_consul(
        self: Arc<Self>,
        client: crate::consul::ConsulClient,
        keys: crate::store::kv_paths::ClusterPaths,
    ) {
        let mut seen = None;
        let mut index = 0;
        loop {
            let asked = tokio::time::Instant::now();
            let wait = Some((index, WATCH_WAIT));
            let gap =
                match crate::store::format::catalog::consul_fingerprint_after(&client, &keys, wait)
                    .await
                {
                    // The first look reloads too: a definition may have changed
                    // between the start-up table and this look.
                    Ok((now, next)) if seen.as_ref() != Some(&now) => {
                        index = if next < index { 0 } else { next };
                        seen = Some(now);
                        log_reload("watch", self.reload("watch").await);
                        WATCH_GAP
                    }
                    Ok((_, next)) => {
                        index = if next < index { 0 } else { next };
                        WATCH_QUIET_GAP
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "format definitions not read; trying again");
                        index = 0;
                        WATCH_QUIET_GAP
                    }
                };
            tokio::time::sleep_until(asked + gap).await;
        }
    }

    /// Reloads on every SIGHUP (the config file read again first). The
    /// signal is registered here, before the returned future first runs,
    /// so a SIGHUP right after this returns is not missed (nor does it
    /// take the default action, ending the process). The TLS reloader
    /// listens too: each listener gets every signal. Runs until aborted.
    pub fn watch_sighup(self: Arc<Self>) -> impl std::future::Future<Output = ()> + Send {
        use tokio::signal::unix::{signal, SignalKind};
        let hup = signal(SignalKind::hangup());
        async move {
            let mut hup = match hup {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGHUP: formats reload only through the admin API");
                    return;
                }
            };
            while hup.recv().await.is_some() {
                log_reload("sighup", self.reload_config("sighup").await);
            }
        }
    }
}

/// `new` with the stored origin year when it gives none (config entries
/// and update files need not repeat what creation stamped).
fn inherit_origin(mut new: FormatDef, stored: &FormatDef) -> FormatDef {
    if new.origin_year.is_none() {
        new.origin_year = stored.origin_year;
    }
    new
}

fn def_json(def: &FormatDef) -> String {
    serde_json::to_string(def).unwrap_or_else(|e| format!("<{e}>"))
}

fn count(trigger: &'static str, result: &Result<Reloaded, ReloadError>) {
    let label = if result.is_ok() { "ok" } else { "error" };
    metrics::counter!(m::FORMAT_RELOADS, "trigger" => trigger, "result" => label).increment(1);
}

fn log_reload(trigger: &'static str, result: Result<Reloaded, ReloadError>) {
    match result {
        Ok(r) => tracing::info!(
            trigger,
            formats = ?r.formats,
            changed = ?r.changed,
            "formats reloaded"
        ),
        Err(e) => tracing::error!(
            trigger,
            format = e.format.as_deref(),
            error = %e,
            "formats reload failed; the previous formats are still served"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::format::Reset;
    use crate::id::SystemClock;
    use crate::modes::formatted::FormatSettings;
    use crate::store::EmbeddedStore;

    fn catalog(dir: &std::path::Path) -> (EmbeddedStore, FormatCatalog) {
        let store = EmbeddedStore::create(&dir.join("s.redb"), "layout").unwrap();
        let catalog = catalog_on(&store);
        (store, catalog)
    }

    /// A catalog serving nothing yet over `store`: a node (re)starting.
    fn catalog_on(store: &EmbeddedStore) -> FormatCatalog {
        catalog_with(store, crate::id::format::lua::DEFAULT_CHECK_BUDGET)
    }

    /// [`catalog_on`] with a Lua check budget of `budget`.
    fn catalog_with(store: &EmbeddedStore, budget: Duration) -> FormatCatalog {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let settings = FormatSettings {
            lua_check_budget: budget,
            ..FormatSettings::for_tests(10, 3)
        };
        let counters = Arc::new(store.clone());
        let formats = FormattedEngine::new(&[], counters, Arc::clone(&clock), settings, 0).unwrap();
        let defs: Arc<dyn FormatCatalogStore> = Arc::new(store.clone());
        FormatCatalog::new(defs, Arc::new(formats), clock, Vec::new())
    }

    /// A Lua format `name` whose IDs start with `prefix`.
    fn lua_def(name: &str, prefix: &str) -> FormatDef {
        let mut def = FormatDef::template(name, "", "UTC", Reset::Never);
        (def.template, def.reset) = (None, None);
        def.lua = Some(format!(
            "function min_counter() return 0 end\nfunction max_counter() return 999 end\nfunction reset_seconds() return 0 end\nfunction create_id(counter, now, salt) return string.format('{prefix}%04d', counter) end\n"
        ));
        def
    }

    /// How many Lua rules' checks the catalog's engine ran.
    fn checks_run(catalog: &FormatCatalog) -> u64 {
        catalog.formats().check_runs().runs()
    }

    /// As another node would: the definition stored, this node not told.
    async fn stored_elsewhere(store: &EmbeddedStore, name: &str) {
        let def = FormatDef::template(name, "{seq:6}", "UTC", Reset::Never);
        store_def(store, def).await;
    }

    /// `def` stored as a node of an earlier version would: no check key.
    async fn store_def(store: &EmbeddedStore, def: FormatDef) {
        let now = SystemClock.now_millis();
        let def = def.stamped(now as i64).unwrap();
        let record = StoredFormat {
            def,
            deleted: false,
            source: DefSource::Admin,
            created_ms: now,
            updated_ms: now,
            fresh: false,
            lua_checked: None,
        };
        FormatCatalogStore::create(store, &record).await.unwrap();
    }

    /// A call naming a format stored (by another node) after the last
    /// miss reload, inside that reload's gap, is served once it returns:
    /// it waits for a reload that started after it came. Calls waiting in
    /// one gap share that one reload.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_miss_inside_the_gap_waits_for_a_reload_that_sees_its_format() {
        let dir = tempfile::tempdir().unwrap();
        let (store, catalog) = catalog(dir.path());
        let catalog = Arc::new(catalog);
        catalog.reload_on_miss().await; // a typo: the gap starts now
        stored_elsewhere(&store, "later").await;
        let calls: Vec<_> = (0..8)
            .map(|_| {
                let c = Arc::clone(&catalog);
                tokio::spawn(async move { c.reload_on_miss().await })
            })
            .collect();
        for call in calls {
            call.await.unwrap();
        }
        assert!(
            catalog.formats().get("later").is_ok(),
            "the format stored before the calls is served when they return"
        );
        let reloads = catalog.misses.started();
        assert_eq!(reloads, 2, "the typo's reload, then one for the 8 calls");
    }

    /// Issue 34 item 5: the Issuer's parse path learns a format another
    /// node defined moments ago by itself, as issuing does. Before, each
    /// front end called `learn_format` first and the Issuer's parse alone
    /// refused the format as unknown.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn parsing_learns_a_format_another_node_defined() {
        for admin in [None, Some("ops")] {
            let dir = tempfile::tempdir().unwrap();
            let (store, catalog) = catalog(dir.path());
            let (issuer, _) = crate::modes::tests::issuer();
            let issuer = issuer.with_catalog(Arc::new(catalog));
            stored_elsewhere(&store, "later").await;
            let (parsed, view) = issuer
                .parse_formatted_as("later", "000042", admin)
                .await
                .expect("learned, then parsed");
            assert_eq!((parsed.seq, view.is_none()), (42, true), "{admin:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        let (store, catalog) = catalog(dir.path());
        let (issuer, _) = crate::modes::tests::issuer();
        let issuer = issuer.with_catalog(Arc::new(catalog));
        stored_elsewhere(&store, "later").await;
        let parsed = issuer.parse_formatted("later", "000007").await;
        assert_eq!(parsed.expect("learned, then parsed").seq, 7);
    }

    /// Issue 32, item 8: a created Lua rule is checked once. Before, the
    /// reload after the create compiled and checked it again (2 runs),
    /// under the lock every other change and reload waits for.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_created_lua_rule_is_checked_once_and_served() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, catalog) = catalog(dir.path());
        let (written, reloaded) = catalog.create(lua_def("rule", "R"), false).await.unwrap();
        assert_eq!(checks_run(&catalog), 1);
        assert_eq!(reloaded.changed, vec!["rule".to_owned()]);
        assert!(catalog.formats().get("rule").is_ok());
        let key = written.def.lua_check_key(catalog.formats().lua_limits());
        assert!(key.is_some() && written.lua_checked == key, "{written:?}");
        // An update (the description) keeps the key and checks nothing.
        let mut described = lua_def("rule", "R");
        described.description = "orders".into();
        let (updated, _) = catalog.update(described).await.unwrap();
        assert_eq!(checks_run(&catalog), 1);
        assert_eq!(updated.lua_checked, key);
        assert_eq!(
            catalog.formats().get("rule").unwrap().def().description,
            "orders"
        );
    }

    /// Issue 32, item 8: the slow rule of the issue is refused at
    /// CreateFormat within the budget, as a bad argument naming the budget
    /// and what to do, and nothing is stored.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rule_too_slow_to_check_is_refused_at_create_naming_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = catalog(dir.path());
        let catalog = catalog_with(&store, Duration::from_millis(300));
        let mut slow = lua_def("slow", "S");
        slow.lua = Some("function min_counter() return 0 end\nfunction max_counter() return 999 end\nfunction reset_seconds() return 0 end\nfunction create_id(counter, now, salt)\n  local t = {string.byte(string.rep('ba', 50000), 1, -1)}\n  table.sort(t)\n  return string.format('%04d', counter)\nend\n".into());
        let err = catalog.create(slow, false).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRequest, "{err}");
        let message = err.to_string();
        assert!(
            message.contains("formatted.lua_check_budget (300 ms)")
                && message.contains("make create_id cheaper"),
            "{message}"
        );
        assert!(catalog.store().get("slow").await.unwrap().is_none());
    }

    /// Issue 32, item 8: a rule's checks hold no lock. While a reload checks
    /// a stored rule (held here until released, standing in for a slow
    /// rule), another format is created and served, and another reload
    /// completes. Before, the reload checked under the `reloading` lock
    /// and the create waited for it: the create never finished while the
    /// check was held (the bound below turns that wait into a failure).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rule_being_checked_holds_up_no_other_create_or_reload() {
        let dir = tempfile::tempdir().unwrap();
        let (store, catalog) = catalog(dir.path());
        let catalog = Arc::new(catalog);
        store_def(&store, lua_def("held", "H")).await;
        let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = Mutex::new(released);
        let first = std::sync::atomic::AtomicBool::new(true);
        *catalog.formats().check_runs().before.lock().unwrap() =
            Some(Arc::new(move |name: &str| {
                if name == "held" && first.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    let _ = entered_tx.send(());
                    let _ = released.lock().unwrap().recv();
                }
            }));
        let held = tokio::spawn({
            let catalog = Arc::clone(&catalog);
            async move { catalog.reload("watch").await }
        });
        entered.recv().await.expect("the held rule's check began");
        let bound = Duration::from_secs(60);
        let others = async {
            let created = catalog.create(lua_def("quick", "Q"), false).await;
            let reloaded = catalog.reload("admin").await;
            (created, reloaded)
        };
        let (created, reloaded) = tokio::time::timeout(bound, others)
            .await
            .expect("another create and reload finish while a rule is being checked");
        assert_eq!(created.unwrap().1.changed, vec!["quick".to_owned()]);
        assert!(catalog.formats().get("quick").is_ok());
        // The other reload checked the held rule itself (not held then).
        assert!(reloaded.unwrap().formats.contains(&"held".to_owned()));
        release.send(()).unwrap();
        let done = held.await.unwrap().unwrap();
        assert_eq!(done.formats, vec!["held".to_owned(), "quick".to_owned()]);
    }

    /// Issue 32, item 8: a restart does not check again a stored rule that
    /// passed its checks (its record keeps their key); a record whose key
    /// does not match (no key: stored before keys; another: other checks
    /// or limits) is checked again, once, and served. Before, every start
    /// checked every stored rule (29 s per 1,000 values of the issue's).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restart_checks_only_rules_without_a_matching_check_key() {
        let dir = tempfile::tempdir().unwrap();
        let (store, catalog) = catalog(dir.path());
        catalog
            .create(lua_def("checked", "C"), false)
            .await
            .unwrap();
        assert_eq!(checks_run(&catalog), 1);
        let restarted = catalog_on(&store);
        restarted.start().await.unwrap();
        assert_eq!(checks_run(&restarted), 0, "nothing checked again");
        assert!(restarted.formats().get("checked").is_ok());
        // Another key, and none: both checked again at the next start.
        let other = Arc::new(|r: &StoredFormat| {
            Ok(StoredFormat {
                lua_checked: Some(format!("sha256:{}", "0".repeat(64))),
                ..r.clone()
            })
        });
        FormatCatalogStore::change(&store, "checked", other)
            .await
            .unwrap();
        store_def(&store, lua_def("legacy", "L")).await;
        let restarted = catalog_on(&store);
        let served = restarted.start().await.unwrap();
        assert_eq!(checks_run(&restarted), 2);
        assert_eq!(
            served.formats,
            vec!["checked".to_owned(), "legacy".to_owned()]
        );
    }
}
