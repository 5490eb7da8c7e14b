//! Formatted-mode counters through `idgen state restore`: a margin per
//! format, stated by the operator.
//!
//! Segment and lease counters move by `--skip-ahead`, strict ones by
//! `--strict-skip-ahead`. Formatted counters are narrow and differ per
//! format (`{seq:4}` holds 10,000 values a period, `{seq:10}` ten
//! billion), so each format gets its own margin (`--format-skip-ahead
//! NAME=N`, or `N` for every format). Nothing in a backup bounds what a
//! format issued after it, so restore never proposes one: it reports what
//! it knows ([`format_facts`]: the highest counter, the room above it, the
//! rate at backup time as information) and the operator states the
//! margin; a current copy (a mirror) needs none.
//!
//! Every counter the snapshot holds moves forward by its format's margin,
//! capped at the format's max (a counter pushed past its max is used up in
//! that period: it continues in the next one). Counters the snapshot does
//! not hold (a new scope value, a period begun after the snapshot) start
//! that margin above their minimum, but only in periods up to the restore
//! instant: a period begun after it starts at its minimum.
//!
//! A format the snapshot does not define but created after the restore may
//! be one the lost node created after the backup and issued from (the
//! operator re-creating it with the same definition), so it gets the
//! restore's margin for new formats ([`new_format_margin`], or the bare
//! `--format-skip-ahead N`) in periods up to the restore instant: for a
//! format that never resets, a one-time offset of its counter. A format
//! whose counter cannot hold that margin is refused at creation
//! ([`FormatError::BelowRestore`]) unless the operator asserts the
//! name never issued an ID (`--fresh`), which skips the margin. A format
//! of the snapshot whose counter cannot hold its margin is named in the
//! restore report with what to do.

use std::collections::BTreeMap;

use super::catalog::StoredFormat;
use super::counters::{
    CounterRecordBytes, FORMATS, FORMATS_RESTORED_UNTIL, FORMAT_RESTORE_FLOORS,
    FORMAT_RESTORE_NEW_FLOOR,
};
use crate::id::format::FormatError;
use crate::id::format::{Format, FormatDef, LuaLimits, Reset};
use crate::store::snapshot::SnapshotInfo;
use crate::store::StoreError;

/// Margins for formatted counters chosen by the operator.
#[derive(Debug, Clone, Default)]
pub struct FormatMargins {
    /// Per format name.
    pub per_format: BTreeMap<String, u64>,
    /// For every format not named (`None`: the restore's `--skip-ahead`).
    pub default: Option<u64>,
}

impl FormatMargins {
    /// The margin of format `name`.
    pub fn margin(&self, name: &str, skip: u64) -> u64 {
        self.per_format
            .get(name)
            .copied()
            .or(self.default)
            .unwrap_or(skip)
    }

    /// Parses `--format-skip-ahead` values: `NAME=N` for one format, `N`
    /// for every other.
    pub fn parse(values: &[String]) -> Result<FormatMargins, String> {
        let mut out = FormatMargins::default();
        for v in values {
            let (name, n) = match v.split_once('=') {
                Some((name, n)) => (Some(name.trim()), n.trim()),
                None => (None, v.trim()),
            };
            let n: u64 = n.parse().map_err(|_| {
                format!("--format-skip-ahead {v:?}: give NAME=N or N, with N a whole number")
            })?;
            match name {
                Some(name) => {
                    out.per_format.insert(name.to_owned(), n);
                }
                None => out.default = Some(n),
            }
        }
        Ok(out)
    }
}

/// What a restore can tell the operator about one format of a snapshot,
/// to state its margin by: never a margin itself.
#[derive(Debug, Clone)]
pub struct FormatFacts {
    /// The format.
    pub name: String,
    /// Its counters in the snapshot.
    pub counters: usize,
    /// The highest value any of them had reserved.
    pub highest: u64,
    /// Its counter's `(min, max, step)`, if the definition compiles.
    pub range: Option<(u64, u64, u64)>,
    /// Its fastest counter's rate when the snapshot was taken, per second.
    pub rate: f64,
}

impl FormatFacts {
    /// One line for the operator.
    pub fn line(&self) -> String {
        let range = match self.range {
            Some((min, max, step)) => format!(
                " of {min}..={max} step {step} (room for {} more in that period)",
                max.saturating_sub(self.highest)
            ),
            None => String::new(),
        };
        format!(
            "format {}: {} counters, the highest at {}{range}; rate when taken {:.1}/s (information only)",
            self.name, self.counters, self.highest, self.rate
        )
    }
}

/// A format's bounds after compiling its stored definition at `now_ms`.
fn compile(def: &FormatDef, now_ms: u64) -> Option<Format> {
    Format::compile(def.clone(), now_ms as i64, LuaLimits::default()).ok()
}

/// The fastest rate (counter values per second) of format `name`'s
/// counters in the snapshot, and which counter it is: per counter when
/// they were sampled one by one, else formatted mode's total.
fn format_rate(info: &SnapshotInfo, name: &str) -> (f64, String) {
    let prefix = format!("format/{name}/");
    let per_counter = info
        .rates
        .keys()
        .any(|k| k.starts_with("format/") && k != "format/*");
    let mut best = (0.0f64, String::new());
    for (k, r) in &info.rates {
        let counts = if per_counter {
            k.starts_with(&prefix)
        } else {
            k == "format/*"
        };
        if counts && *r > best.0 {
            best = (*r, k.clone());
        }
    }
    best
}

/// Whether `margin` fits `format`'s counter: a counter started `margin`
/// above its minimum still has a value left.
fn fits(format: &Format, margin: u64) -> bool {
    let c = format.counter();
    c.min
        .checked_add(margin)
        .and_then(|v| v.checked_add(c.step))
        .is_some_and(|v| v <= c.max)
}

/// What the snapshot says of each format it defines ([`FormatFacts`]),
/// compiled at `now_ms`.
pub fn format_facts(info: &SnapshotInfo, now_ms: u64) -> Vec<FormatFacts> {
    info.format_defs
        .iter()
        .map(|def| {
            let prefix = format!("format/{}/", def.name);
            let values: Vec<u64> = info
                .counters
                .iter()
                .filter(|(k, _)| k.starts_with(&prefix))
                .map(|(_, v)| *v)
                .collect();
            let range = compile(def, now_ms).map(|f| {
                let c = f.counter();
                (c.min, c.max, c.step)
            });
            FormatFacts {
                name: def.name.clone(),
                counters: values.len(),
                highest: values.iter().copied().max().unwrap_or(0),
                range,
                rate: format_rate(info, &def.name).0,
            }
        })
        .collect()
}

/// What a restore did to one format's counters.
#[derive(Debug, Clone)]
pub struct RestoredFormat {
    /// The format.
    pub name: String,
    /// The margin its counters moved by.
    pub margin: u64,
    /// Its counters in the snapshot, all moved.
    pub counters: usize,
    /// Set when its counter cannot hold the margin: what happens and what
    /// to do.
    pub too_narrow: Option<String>,
}

/// Why `format` cannot hold `margin`, and what to do.
fn too_narrow(format: &Format, margin: u64) -> String {
    let c = format.counter();
    let name = format.name();
    let what = if format.reset() == Reset::Never {
        "it never resets, so counters moved past their max stay used up for good: create a new format (another name, or a wider {seq:N}) for new IDs".to_owned()
    } else {
        format!(
            "counters in periods up to the restore answer RESOURCE_EXHAUSTED until their next period (reset {}), then continue from the minimum",
            format.reset()
        )
    };
    format!(
        "format {name}: its counter ({}..={}, step {}) cannot hold the margin {margin}; {what}. If it issued fewer values after the backup, restore again with --format-skip-ahead {name}=<N> covering them",
        c.min, c.max, c.step
    )
}

/// Moves every formatted counter of `txn` into `out` by its format's
/// margin (capped at the format's max), records each live format's margin
/// as the floor of its new counters, and says what it did.
pub(crate) fn move_counters(
    txn: &redb::ReadTransaction,
    out: &redb::WriteTransaction,
    defs: &[FormatDef],
    (margins, skip): (&FormatMargins, u64),
    now_ms: u64,
) -> Result<MovedFormats, StoreError> {
    use crate::store::embedded::backend_err;
    use redb::ReadableTable;
    let compiled: BTreeMap<&str, Option<Format>> = defs
        .iter()
        .map(|d| (d.name.as_str(), compile(d, now_ms)))
        .collect();
    let mut per_format: BTreeMap<String, RestoredFormat> = BTreeMap::new();
    let mut moved = 0;
    match txn.open_table(FORMATS) {
        Ok(from) => {
            let mut to = out.open_table(FORMATS).map_err(backend_err)?;
            for item in from.iter().map_err(backend_err)? {
                let (k, v) = item.map_err(backend_err)?;
                let key = k.value();
                let name = key.split('/').next().unwrap_or_default();
                let margin = margins.margin(name, skip);
                let entry = per_format
                    .entry(name.to_owned())
                    .or_insert_with(|| restored(name, margin));
                entry.counters += 1;
                let mut record = CounterRecordBytes::decode(key, v.value())?;
                let bumped = record.last.saturating_add(margin);
                record.last = match compiled.get(name).and_then(Option::as_ref) {
                    Some(f) => {
                        let c = f.counter();
                        if bumped.saturating_add(c.step) > c.max {
                            entry.too_narrow = Some(too_narrow(f, margin));
                        }
                        bumped.min(c.max)
                    }
                    None => bumped,
                };
                to.insert(key, CounterRecordBytes::encode(&record).as_slice())
                    .map_err(backend_err)?;
                moved += 1;
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(backend_err(e)),
    }
    let mut floors = BTreeMap::new();
    for (name, format) in &compiled {
        let margin = margins.margin(name, skip);
        floors.insert((*name).to_owned(), margin);
        let entry = per_format
            .entry((*name).to_owned())
            .or_insert_with(|| restored(name, margin));
        if let Some(f) = format.as_ref().filter(|f| !fits(f, margin)) {
            entry.too_narrow = Some(too_narrow(f, margin));
        }
    }
    // Each format the snapshot defines floors its new counters (in periods
    // up to the restore) by its own margin; a format created after the
    // restore, by the margin of new formats.
    let json = serde_json::to_string(&floors).map_err(backend_err)?;
    let new_floor = margins.default.unwrap_or(skip).to_string();
    let mut meta = out
        .open_table(crate::store::embedded::META)
        .map_err(backend_err)?;
    meta.insert(FORMAT_RESTORE_FLOORS, json.as_str())
        .map_err(backend_err)?;
    meta.insert(FORMAT_RESTORE_NEW_FLOOR, new_floor.as_str())
        .map_err(backend_err)?;
    // Only formats the snapshot defines are reported (a deleted format's
    // counters move too, but its name can never be used again).
    let report = per_format
        .into_values()
        .filter(|r| compiled.contains_key(r.name.as_str()))
        .collect();
    Ok(MovedFormats {
        counters: moved,
        formats: report,
    })
}

/// What [`move_counters`] did.
pub(crate) struct MovedFormats {
    /// Counters moved.
    pub counters: usize,
    /// Per live format of the snapshot.
    pub formats: Vec<RestoredFormat>,
}

/// The least margin of formats the snapshot does not define: nothing
/// records how much such a format issued between the backup and the loss,
/// so the floor errs high. A counter too narrow for it is refused at
/// creation with the way out (`--fresh`), never floored into exhaustion.
pub const NEW_FORMAT_MIN_MARGIN: u64 = 10_000;

/// The margin of formats created after the restore that the snapshot does
/// not define: nothing records how much such a format issued, so the bare
/// `--format-skip-ahead N` the operator gave, else the largest margin they
/// gave any format, at least [`NEW_FORMAT_MIN_MARGIN`].
pub fn new_format_margin(given: &FormatMargins) -> u64 {
    given.default.unwrap_or_else(|| {
        given
            .per_format
            .values()
            .copied()
            .max()
            .unwrap_or(0)
            .max(NEW_FORMAT_MIN_MARGIN)
    })
}

/// On a restored state file, records the floor of `record`, a format
/// created now that the snapshot did not define (in `txn`, the write that
/// stores the definition): the margin of new formats, or 0 when created
/// `fresh`. Refuses a format whose counter cannot hold the margin in the
/// period it would issue in now.
pub(crate) fn floor_new_format(
    txn: &redb::WriteTransaction,
    record: &StoredFormat,
) -> Result<(), StoreError> {
    use crate::store::embedded::{backend_err, META};
    use redb::ReadableTable;
    let mut meta = txn.open_table(META).map_err(backend_err)?;
    let get = |meta: &redb::Table<&str, &str>, key: &str| -> Result<Option<String>, StoreError> {
        Ok(meta
            .get(key)
            .map_err(backend_err)?
            .map(|v| v.value().to_owned()))
    };
    let unreadable = |key: &str, e: &dyn std::fmt::Display| {
        StoreError::Backend(format!(
            "state file: unreadable {key} ({e}); restore it from a backup"
        ))
    };
    let Some(until) = get(&meta, FORMATS_RESTORED_UNTIL)? else {
        return Ok(()); // never restored
    };
    let until: i64 = until
        .parse()
        .map_err(|e| unreadable(FORMATS_RESTORED_UNTIL, &e))?;
    // A file restored before per-format margins floors every format by the
    // restore floor already.
    let Some(json) = get(&meta, FORMAT_RESTORE_FLOORS)? else {
        return Ok(());
    };
    let mut floors: BTreeMap<String, u64> =
        serde_json::from_str(&json).map_err(|e| unreadable(FORMAT_RESTORE_FLOORS, &e))?;
    let name = &record.def.name;
    if floors.contains_key(name) {
        return Ok(());
    }
    let margin = if record.fresh {
        0
    } else {
        let margin = match get(&meta, FORMAT_RESTORE_NEW_FLOOR)? {
            Some(v) => v
                .parse()
                .map_err(|e| unreadable(FORMAT_RESTORE_NEW_FLOOR, &e))?,
            None => floors.values().copied().max().unwrap_or(0),
        };
        check_new_format(&record.def, record.created_ms as i64, until, margin)?;
        margin
    };
    floors.insert(name.clone(), margin);
    let json = serde_json::to_string(&floors).map_err(backend_err)?;
    meta.insert(FORMAT_RESTORE_FLOORS, json.as_str())
        .map_err(backend_err)?;
    Ok(())
}

/// Refuses `def`, created at `now_ms`, if its counter in the current period
/// must start `margin` above its minimum (the period began at or before the
/// restore instant `until_ms`) and cannot hold that.
fn check_new_format(
    def: &FormatDef,
    now_ms: i64,
    until_ms: i64,
    margin: u64,
) -> Result<(), StoreError> {
    // The caller compiled it already; one that does not compile issues nothing.
    let Ok(format) = Format::compile(def.clone(), now_ms, LuaLimits::default()) else {
        return Ok(());
    };
    let floored = match (format.decide(None, now_ms), format.decide(None, until_ms)) {
        (Ok(now), Ok(restore)) => now.key <= restore.key,
        _ => true,
    };
    if !floored || fits(&format, margin) {
        return Ok(());
    }
    let c = format.counter();
    Err(StoreError::Format(FormatError::BelowRestore {
        format: def.name.clone(),
        margin,
        until_ms,
        range: format!("{}..={}, step {}", c.min, c.max, c.step),
    }))
}

fn restored(name: &str, margin: u64) -> RestoredFormat {
    RestoredFormat {
        name: name.to_owned(),
        margin,
        counters: 0,
        too_narrow: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::snapshot::Counters;

    fn info(rates: &[(&str, f64)], defs: Vec<FormatDef>) -> SnapshotInfo {
        SnapshotInfo {
            taken_at_ms: 0,
            layout: "L".into(),
            rates_known: true,
            rates_note: "measured".into(),
            rates: rates.iter().map(|(k, r)| ((*k).to_owned(), *r)).collect(),
            counters: Counters::from([
                ("format/inv/cluster/_".to_owned(), 20_099),
                ("format/daily/cluster/_".to_owned(), 700),
            ]),
            largest_step: 1_000_000,
            lease_block: 0,
            floor: 0,
            strict_floor: 0,
            taken_after_loss: false,
            mirror: false,
            formatted_block: 100,
            format_defs: defs,
        }
    }

    /// Each format's facts come from its own counters: the highest, the
    /// room above it in its counter, and the rate as information.
    #[test]
    fn each_format_reports_its_own_highest_counter_and_room() {
        let defs = vec![
            FormatDef::template("inv", "INV{seq:10}", "UTC", Reset::Never),
            FormatDef::template("daily", "{yyyy}{MM}{dd}{seq:6}", "UTC", Reset::Day),
            FormatDef::template("tiny", "T{seq:2}", "UTC", Reset::Never),
        ];
        let info = info(
            &[
                ("format/inv/cluster/_", 1_000.0),
                ("format/daily/cluster/_", 10.0),
                ("segment/orders", 5.0),
            ],
            defs,
        );
        let f = format_facts(&info, 10_000);
        let by = |n: &str| f.iter().find(|f| f.name == n).unwrap().line();
        assert_eq!(
            by("inv"),
            "format inv: 1 counters, the highest at 20099 of 0..=9999999999 step 1 (room for 9999979900 more in that period); rate when taken 1000.0/s (information only)"
        );
        assert!(
            by("daily").contains("room for 999299 more"),
            "{}",
            by("daily")
        );
        assert!(by("tiny").contains("0 counters"), "{}", by("tiny"));
        // The margin of formats the snapshot does not define: the bare N,
        // else the largest given, at least 10,000.
        let given = FormatMargins::parse(&["inv=50000".into()]).unwrap();
        assert_eq!(new_format_margin(&given), 50_000);
        assert_eq!(new_format_margin(&FormatMargins::default()), 10_000);
        let bare = FormatMargins::parse(&["70".into()]).unwrap();
        assert_eq!(new_format_margin(&bare), 70);
    }

    #[test]
    fn format_margins_parse_names_and_a_default() {
        let m = FormatMargins::parse(&["inv=500".into(), "70".into()]).unwrap();
        assert_eq!(m.margin("inv", 9), 500);
        assert_eq!(m.margin("other", 9), 70);
        assert_eq!(FormatMargins::default().margin("inv", 9), 9);
        let e = FormatMargins::parse(&["inv=lots".into()]).unwrap_err();
        assert!(e.contains("NAME=N"), "{e}");
    }

    /// The create path every new definition takes (admin API and a
    /// `[[formats]]` entry stored for the first time): on a restored file a
    /// format the snapshot did not define is floored by the margin of new
    /// formats, refused when too narrow for it, and floored at 0 when
    /// created fresh.
    #[tokio::test]
    async fn formats_new_since_a_restore_are_floored_refused_or_fresh() {
        use crate::store::embedded::{EmbeddedStore, META};
        use crate::store::format::catalog::{DefSource, FormatCatalogStore};
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::create(&dir.path().join("s.redb"), "L").unwrap();
        let txn = store.begin_write().unwrap();
        {
            let mut meta = txn.open_table(META).unwrap();
            meta.insert(FORMATS_RESTORED_UNTIL, "1000").unwrap();
            meta.insert(FORMAT_RESTORE_FLOORS, r#"{"old":50}"#).unwrap();
            meta.insert(FORMAT_RESTORE_NEW_FLOOR, "200").unwrap();
        }
        store.commit(txn).unwrap();
        let record = |name: &str, template: &str, fresh: bool| StoredFormat {
            def: FormatDef::template(name, template, "UTC", Reset::Never),
            deleted: false,
            source: DefSource::Config,
            created_ms: 5000,
            updated_ms: 5000,
            fresh,
            lua_checked: None,
        };
        let refused = store
            .create(&record("small", "S{seq:2}", false))
            .await
            .unwrap_err();
        assert!(
            matches!(
                refused,
                StoreError::Format(FormatError::BelowRestore { margin: 200, .. })
            ),
            "{refused}"
        );
        assert!(
            store.get("small").await.unwrap().is_none(),
            "nothing stored"
        );
        store
            .create(&record("small", "S{seq:2}", true))
            .await
            .unwrap();
        store
            .create(&record("late", "L{seq:6}", false))
            .await
            .unwrap();
        let txn = store.begin_write().unwrap();
        let floor = |name: &str| store.restore_floor(&txn, name).unwrap().map(|f| f.floor);
        assert_eq!(floor("small"), Some(0));
        assert_eq!(floor("late"), Some(200));
        assert_eq!(floor("old"), Some(50));
    }
}
