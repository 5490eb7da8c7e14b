//! Hidden output: the hider a hidden namespace (a segment tag created with
//! `hide`, a format with `{seq:N:hidden}` or `hide = true`, a lease zone
//! with `[lease.hide]`) shows its IDs through.
//!
//! A [`HiddenOutput`] is built once per namespace and rebuilt only when the
//! key ring changed ([`HideKeyRings::subscribe`]), never per call: a call
//! loads the hider and reads the change counter ([`HiddenOutput::ready`],
//! two atomic loads, no lock) and, when the key cannot serve
//! (missing, retired, or an active version the field cannot hold), is
//! refused before it takes any value, so nothing is reserved or leaked.
//! The engines map an internal value only after the range, block or counter
//! that holds it was reserved: hiding never changes what is reserved.

use std::sync::Arc;

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use arc_swap::ArcSwap;
use tokio::sync::watch;

use super::hide_keys::HideKeyRings;
use crate::error::Error;
use crate::id::format::{Format, FormatError};
use crate::id::hide::{
    DecimalHider, HideError, HideKey, Hider, IntHider, KeyVersion, SnowflakeHider, SnowflakeHiding,
    UuidHider,
};
use crate::id::{Layout, UuidLayout};
use crate::store::StoreError;

/// Builds a hider from every version of a ring and its active version.
pub type BuildHider<H> =
    Box<dyn Fn(&[&HideKey], KeyVersion) -> Result<H, HideError> + Send + Sync + 'static>;

/// One namespace's hider, kept current with its key ring.
pub struct HiddenOutput<H> {
    namespace: String,
    key_id: String,
    rings: Option<HideKeyRings>,
    build: BuildHider<H>,
    /// The hider as last built, with the change receiver it was built
    /// after: one load per call, and a rebuild only when the ring changed.
    current: ArcSwap<Built<H>>,
    /// One rebuild at a time.
    rebuilding: Mutex<()>,
}

/// A hider (or why there is none) and the ring changes it has seen.
struct Built<H> {
    /// Subscribed before the ring was read: any later change shows here.
    changes: Option<watch::Receiver<u64>>,
    /// The hider, or the refusal naming the key and the fix.
    hider: Result<Arc<H>, String>,
}

// Key-ring tracking needs no `Hider`: the UUID hider (128-bit values)
// is kept current the same way.
impl<H: Send + Sync + 'static> HiddenOutput<H> {
    /// The output of `namespace` (as messages name it, e.g. `segment tag
    /// "orders"`) through key `key_id`. `rings` is `None` on a node with no
    /// hide keys loaded (no master key): every call is then refused.
    pub fn new(
        namespace: String,
        key_id: &str,
        rings: Option<HideKeyRings>,
        build: BuildHider<H>,
    ) -> Arc<Self> {
        let this = Self {
            namespace,
            key_id: key_id.to_owned(),
            rings,
            build,
            current: ArcSwap::from_pointee(Built {
                changes: None,
                hider: Err(String::new()),
            }),
            rebuilding: Mutex::new(()),
        };
        this.current.store(Arc::new(this.build_now()));
        Arc::new(this)
    }

    /// Builds from the ring as it is now; subscribed first, so a change
    /// that lands while it builds is seen by the next call.
    fn build_now(&self) -> Built<H> {
        let changes = self.rings.as_ref().map(HideKeyRings::subscribe);
        let hider = self.hider_now().map(Arc::new);
        if let Err(reason) = &hider {
            tracing::warn!(namespace = %self.namespace, key = %self.key_id, %reason, "hidden namespace cannot issue");
        }
        Built { changes, hider }
    }

    fn hider_now(&self) -> Result<H, String> {
        let key = &self.key_id;
        let Some(rings) = self.rings.as_ref().filter(|r| r.has_master()) else {
            return Err("this node has no hide keys loaded; set hide.master_key_file or IDGEN_HIDE_MASTER_KEY and restart it".into());
        };
        let Some(ring) = rings.current(key) else {
            return Err(format!(
                "hide key {key:?} does not exist; create it with `idgen admin keys create {key}`"
            ));
        };
        let Some(active) = ring.active else {
            return Err(format!(
                "hide key {key:?} is retired (decode-only); give it a new active version with `idgen admin keys rotate {key}`"
            ));
        };
        let keys: Vec<&HideKey> = ring.keys.iter().collect();
        (self.build)(&keys, active).map_err(|e| match e {
            // Versions only go up: no rotation brings this field back.
            HideError::VersionOutOfRange { .. } => format!("hide key {key:?}: {e}"),
            e => format!(
                "hide key {key:?} version {active}: {e}; create the namespace with a wider field"
            ),
        })
    }

    /// The hider for one call, or the refusal naming the key and the fix.
    /// Call it before taking any value. One pointer load and one atomic
    /// read of the ring's change counter; the hider is rebuilt only when
    /// the ring changed since it was built, so a call that starts after a
    /// rotation or retirement returned uses the new ring.
    pub fn ready(&self) -> Result<Ready<'_, H>, Error> {
        let mut built = self.current.load_full();
        let changed = built
            .changes
            .as_ref()
            .is_some_and(|c| c.has_changed().unwrap_or(false));
        if changed {
            let _one = self
                .rebuilding
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            built = self.current.load_full();
            if built
                .changes
                .as_ref()
                .is_some_and(|c| c.has_changed().unwrap_or(false))
            {
                built = Arc::new(self.build_now());
                self.current.store(Arc::clone(&built));
            }
        }
        match &built.hider {
            Ok(hider) => Ok(Ready {
                hider: Arc::clone(hider),
                output: self,
            }),
            Err(reason) => Err(self.refusal(reason.clone())),
        }
    }

    fn refusal(&self, reason: String) -> Error {
        Error::Hidden {
            namespace: self.namespace.clone(),
            key: self.key_id.clone(),
            reason,
        }
    }

    /// The key id.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }
}

/// A hider ready for one call.
pub struct Ready<'a, H> {
    hider: Arc<H>,
    output: &'a HiddenOutput<H>,
}

impl<H> Ready<'_, H> {
    /// The hider itself.
    pub fn hider(&self) -> &H {
        &self.hider
    }
}

impl<H: Hider> Ready<'_, H> {
    /// Shows `internal`. A value outside the field's domain (the engines
    /// bound their counters to it, so never in practice) is refused.
    pub fn hide(&self, internal: u64) -> Result<u64, Error> {
        self.hider()
            .hide(internal)
            .map_err(|e| self.output.refusal(e.to_string()))
    }

    /// Shows every value of `values` in place, in one batch (the hiders
    /// pipeline its AES calls); the same values as [`Ready::hide`] one by
    /// one.
    pub fn hide_all(&self, values: &mut [u64]) -> Result<(), Error> {
        self.hider()
            .hide_in_place(values)
            .map_err(|e| self.output.refusal(e.to_string()))
    }
}

/// The values shown for `internal`, in order: for a hidden namespace all
/// of them hidden in one batch ([`Ready::hide_all`], so a GenFormatted of
/// many IDs pipelines its AES calls like a GenIds), for a plain one the
/// values themselves. Either every value is shown or the call is refused.
pub fn shown_all<H: Hider>(
    hider: Option<&Ready<'_, H>>,
    internal: impl Iterator<Item = u64>,
) -> Result<Vec<u64>, Error> {
    let mut values: Vec<u64> = internal.collect();
    if let Some(hider) = hider {
        hider.hide_all(&mut values)?;
    }
    Ok(values)
}

/// The keys of a ring whose versions a field holding versions `0..=max`
/// can carry. A ring may hold more (its key id also serves a wider field,
/// or was rotated past this one): no ID of this field carries such a
/// version, and leaving them out keeps the IDs it did make decodable.
fn fitting<'a>(keys: &[&'a HideKey], max: KeyVersion) -> Vec<&'a HideKey> {
    keys.iter()
        .copied()
        .filter(|k| k.version() <= max)
        .collect()
}

/// The largest version a field of `version_bits` holds (1 to 8 bits; the
/// hiders refuse other widths themselves, so any other width passes every
/// key through to that refusal).
fn field_max(version_bits: u32) -> KeyVersion {
    if (1..=8).contains(&version_bits) {
        ((1u32 << version_bits) - 1) as KeyVersion
    } else {
        KeyVersion::MAX
    }
}

/// The output of a hidden segment tag or lease zone: [`IntHider`] over its
/// widths.
pub fn int_output(
    namespace: String,
    key_id: &str,
    rings: Option<HideKeyRings>,
    version_bits: u32,
    domain_bits: u32,
) -> Arc<HiddenOutput<IntHider>> {
    HiddenOutput::new(
        namespace,
        key_id,
        rings,
        Box::new(move |keys, active| {
            let max = field_max(version_bits);
            IntHider::new(&fitting(keys, max), active, version_bits, domain_bits)
        }),
    )
}

/// The output of a hidden snowflake layout: [`SnowflakeHider`] over the
/// public `layout` (the generator composes under its effective layout).
pub fn snowflake_output(
    key_id: &str,
    rings: Option<HideKeyRings>,
    layout: Layout,
    hiding: SnowflakeHiding,
    version_bits: u32,
) -> Arc<HiddenOutput<SnowflakeHider>> {
    HiddenOutput::new(
        "the snowflake layout".into(),
        key_id,
        rings,
        Box::new(move |keys, active| {
            // A ring rotated past this field still reveals the IDs it made.
            let max = field_max(version_bits);
            SnowflakeHider::new(&fitting(keys, max), active, &layout, hiding, version_bits)
        }),
    )
}

/// The output of UUIDv7 on a sortable hidden layout: [`UuidHider`] over
/// the node's UUID layout, with the layout's key and version width.
pub fn uuid_output(
    key_id: &str,
    rings: Option<HideKeyRings>,
    layout: UuidLayout,
    version_bits: u32,
) -> Arc<HiddenOutput<UuidHider>> {
    HiddenOutput::new(
        "UUIDs".into(),
        key_id,
        rings,
        Box::new(move |keys, active| {
            let max = ((1u32 << version_bits.min(8)) - 1) as KeyVersion;
            UuidHider::new(&fitting(keys, max), active, &layout, version_bits)
        }),
    )
}

/// The output of a `{seq:N:hidden}` counter: [`DecimalHider`] over its N
/// digits (one of them the key version).
pub fn decimal_output(
    namespace: String,
    key_id: &str,
    rings: Option<HideKeyRings>,
    digits: u32,
) -> Arc<HiddenOutput<DecimalHider>> {
    HiddenOutput::new(
        namespace,
        key_id,
        rings,
        Box::new(move |keys, active| DecimalHider::new(&fitting(keys, 9), active, digits)),
    )
}

/// What a hidden counter shows (`ParseFormatted`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HiddenView {
    /// The key version it was shown with.
    pub key_version: KeyVersion,
    /// The internal counter: only for admin callers.
    pub internal: Option<u64>,
}

/// Formatted mode's hidden outputs: one per format, key and width.
#[derive(Default)]
pub struct FormatHiders {
    rings: Option<HideKeyRings>,
    outputs: Mutex<HashMap<FormatHiderId, Arc<HiddenOutput<DecimalHider>>>>,
}

/// A hidden format's output id: format name, key id, counter width.
type FormatHiderId = (String, String, u8);

impl FormatHiders {
    /// Outputs over the keys of `rings`.
    pub fn new(rings: HideKeyRings) -> Self {
        Self {
            rings: Some(rings),
            outputs: Mutex::default(),
        }
    }

    /// The output `format` shows its counter through (`None` for a plain
    /// format), built once per format, key and width.
    pub fn output(&self, format: &Format) -> Option<Arc<HiddenOutput<DecimalHider>>> {
        let t = format.template().filter(|_| format.hides_counter())?;
        let def = format.def();
        let id = (
            def.name.clone(),
            def.hide_key_id().to_owned(),
            t.seq_width(),
        );
        let mut outputs = self.outputs.lock().unwrap_or_else(PoisonError::into_inner);
        let output = outputs.entry(id).or_insert_with(|| {
            decimal_output(
                format!("format {:?}", def.name),
                def.hide_key_id(),
                self.rings.clone(),
                u32::from(t.seq_width()),
            )
        });
        Some(Arc::clone(output))
    }

    /// What the shown counter `shown` of `format` reveals: its key version
    /// (the first digit) to anyone, and the internal counter only when
    /// `reveal` (an admin caller). `None` for a plain format.
    pub fn view(
        &self,
        format: &Format,
        shown: u64,
        reveal: bool,
    ) -> Result<Option<HiddenView>, Error> {
        let Some(output) = self.output(format) else {
            return Ok(None);
        };
        let width = format.template().map_or(1, |t| t.seq_width());
        if !reveal {
            return Ok(Some(HiddenView {
                key_version: (shown / 10u64.pow(u32::from(width).saturating_sub(1))) as KeyVersion,
                internal: None,
            }));
        }
        let (key_version, internal) = output.reveal(shown).map_err(|e| match e {
            RevealError::Refused(e) => *e,
            RevealError::Hide(e) => Error::from(StoreError::from(FormatError::BadCounter {
                format: format.name().to_owned(),
                why: format!("{shown} is not a counter this format showed: {e}"),
            })),
        })?;
        Ok(Some(HiddenView {
            key_version,
            internal: Some(internal),
        }))
    }
}

/// Why a shown value could not be revealed.
pub enum RevealError {
    /// No ring to reveal with (missing key, no keys loaded); boxed, as
    /// the rare case, so the common `Hide` stays small.
    Refused(Box<Error>),
    /// The value was not shown by this key (wrong width, unknown version).
    Hide(HideError),
}

impl<H: Hider> HiddenOutput<H> {
    /// The key version and internal value behind `shown`. Works with a
    /// retired key too (decode-only), and with a key rotated past what the
    /// field holds: then a hider is built for this call from the ring's
    /// newest version the field holds.
    pub fn reveal(&self, shown: u64) -> Result<(KeyVersion, u64), RevealError> {
        self.revealer()?.reveal(shown).map_err(RevealError::Hide)
    }
}

impl<H: Send + Sync + 'static> HiddenOutput<H> {
    /// The hider to reveal with (see [`HiddenOutput::reveal`]): the one
    /// in service, or one built for this call from the ring's newest
    /// version the field holds when the key is retired or rotated past
    /// the field.
    pub fn revealer(&self) -> Result<Arc<H>, RevealError> {
        if let Ok(ready) = self.ready() {
            return Ok(ready.hider);
        }
        let ring = self
            .rings
            .as_ref()
            .and_then(|r| r.current(&self.key_id))
            .ok_or_else(|| {
                RevealError::Refused(Box::new(self.refusal(format!(
                    "hide key {:?} is not loaded on this node",
                    self.key_id
                ))))
            })?;
        let keys: Vec<&HideKey> = ring.keys.iter().collect();
        let newest = keys.iter().map(|k| k.version()).max().unwrap_or(0);
        let hider = match (self.build)(&keys, newest) {
            // The key went past this field: its IDs carry older versions.
            Err(HideError::VersionOutOfRange { max, .. }) => {
                let fits = keys.iter().map(|k| k.version()).filter(|v| *v <= max);
                (self.build)(&keys, fits.max().unwrap_or(0))
            }
            built => built,
        }
        .map_err(RevealError::Hide)?;
        Ok(Arc::new(hider))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::hide_keys::{HideKeys, MasterKey};

    /// A GenFormatted of many IDs of a `{seq:N:hidden}` format hides its
    /// counters in one batch ([`shown_all`], rule 25): for every width a
    /// format takes (7 to 18 digits, FF1 over 6 to 17), batches of 1 to
    /// 100 IDs, partial and whole lanes of eight, show exactly what the
    /// single path ([`Ready::hide`]) shows for the counters 0, 1, 2, ...
    /// in turn, so no batch maps a value to another value's ID.
    #[tokio::test]
    async fn a_formatted_batch_shows_what_one_by_one_hiding_shows() {
        use crate::id::format::{FormatDef, Reset};
        use crate::modes::formatted::{FormatSettings, FormattedEngine};
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Arc::new(
            crate::store::EmbeddedStore::create(&dir.path().join("s.redb"), "test")
                .expect("state file"),
        );
        let master = Arc::new(MasterKey::from_bytes([5; 32]));
        let keys = HideKeys::new(store.clone(), Some(master));
        let rings = HideKeyRings::load(Arc::new(keys)).await.expect("rings");
        rings.create("k", "test").await.expect("create");
        let widths = 7..=18u32;
        let defs: Vec<FormatDef> = widths
            .clone()
            .map(|w| FormatDef {
                hide_key: Some("k".into()),
                ..FormatDef::template(
                    &format!("f{w}"),
                    &format!("H{{seq:{w}:hidden}}"),
                    "UTC",
                    Reset::Never,
                )
            })
            .collect();
        let settings = FormatSettings::for_tests(50, 3);
        let clock = Arc::new(crate::id::ManualClock::at_millis(1_780_000_000_000));
        let engine = FormattedEngine::new(&defs, store, clock, settings, 0)
            .expect("engine")
            .with_hide_rings(rings.clone());
        for w in widths {
            let mut shown = Vec::new();
            for n in [1, 7, 8, 9, 19, 100] {
                let issued = engine
                    .generate(&format!("f{w}"), &[], n, 0)
                    .await
                    .expect("issue");
                assert_eq!(issued.ids.len(), n as usize);
                shown.extend(
                    issued
                        .ids
                        .iter()
                        .map(|r| r.text[1..].parse::<u64>().expect("digits")),
                );
            }
            let single = decimal_output("format".into(), "k", Some(rings.clone()), w);
            let single = single.ready().expect("the key serves");
            for (i, s) in shown.iter().enumerate() {
                let one = single.hide(i as u64).expect("hide");
                assert_eq!(
                    *s, one,
                    "width {w}: counter {i} shown as {s} in a batch, {one} alone"
                );
            }
        }
    }

    /// A key rotated past what a hidden decimal field holds (versions 0 to
    /// 9) stops that field issuing for good, and says so without sending
    /// the operator to rotate again; the IDs the field did make still
    /// reveal (admin ParseFormatted), and a wider field on the same key id
    /// keeps issuing with the new version.
    #[tokio::test]
    async fn a_key_rotated_past_the_field_refuses_for_good_and_old_ids_still_reveal() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = crate::store::EmbeddedStore::create(&dir.path().join("s.redb"), "test")
            .expect("state file");
        let master = Arc::new(MasterKey::from_bytes([3; 32]));
        let keys = HideKeys::new(Arc::new(store), Some(master));
        let rings = HideKeyRings::load(Arc::new(keys)).await.expect("rings");
        rings.create("k", "test").await.expect("create");
        let out = decimal_output("format \"f\"".into(), "k", Some(rings.clone()), 8);
        let wide = int_output("segment tag \"t\"".into(), "k", Some(rings.clone()), 4, 30);
        let shown: Vec<u64> = (0..50)
            .map(|i| out.ready().expect("v0 issues").hide(i).expect("hide"))
            .collect();
        for _ in 0..10 {
            rings.rotate("k", "test").await.expect("rotate");
        }
        let refused = out.ready().err().expect("version 10 does not fit 1 digit");
        let text = refused.to_string();
        assert!(text.contains("version 10"), "{text}");
        assert!(!text.contains("rotate to"), "no rotation helps: {text}");
        for (i, s) in shown.iter().enumerate() {
            match out.reveal(*s) {
                Ok(v) => assert_eq!(v, (0, i as u64)),
                Err(_) => panic!("ID {s} of version 0 no longer reveals"),
            }
        }
        let w = wide.ready().expect("a 4-bit field holds version 10");
        assert_eq!(
            w.hider().reveal(w.hide(7).expect("hide")).ok(),
            Some((10, 7))
        );
    }

    /// The same for a hidden snowflake layout: a key id shared with a
    /// wider field and rotated past the layout's 1-bit version field
    /// stops the layout issuing, and every snowflake ID it made still
    /// reveals (DecodeId) to the internal ID it was made from.
    #[tokio::test]
    async fn a_snowflake_layout_whose_key_rotated_past_its_field_still_reveals_its_ids() {
        use crate::id::{LayoutSpec, DEFAULT_EPOCH_MS};
        let dir = tempfile::tempdir().expect("temp dir");
        let store = crate::store::EmbeddedStore::create(&dir.path().join("s.redb"), "test")
            .expect("state file");
        let master = Arc::new(MasterKey::from_bytes([4; 32]));
        let keys = HideKeys::new(Arc::new(store), Some(master));
        let rings = HideKeyRings::load(Arc::new(keys)).await.expect("rings");
        rings.create("k", "test").await.expect("create");
        let layout = LayoutSpec {
            epoch_ms: DEFAULT_EPOCH_MS,
            time_unit_ms: 1,
            time_bits: 41,
            datacenter_bits: 5,
            worker_bits: 5,
            sequence_bits: 12,
        }
        .validate(DEFAULT_EPOCH_MS + 1)
        .expect("layout");
        let out = snowflake_output("k", Some(rings.clone()), layout, SnowflakeHiding::Opaque, 1);
        let internal: Vec<u64> = (0..50u64).map(|i| i * 1_000_003 + 17).collect();
        let shown: Vec<u64> = internal
            .iter()
            .map(|i| out.ready().expect("v0 issues").hide(*i).expect("hide"))
            .collect();
        rings.rotate("k", "test").await.expect("rotate to 1");
        let one = out
            .ready()
            .expect("version 1 fits 1 bit")
            .hide(5)
            .expect("hide");
        rings.rotate("k", "test").await.expect("rotate to 2");
        let refused = out.ready().err().expect("version 2 does not fit 1 bit");
        assert!(refused.to_string().contains("version 2"), "{refused}");
        for (s, i) in shown.iter().zip(&internal) {
            match out.reveal(*s) {
                Ok(v) => assert_eq!(v, (0, *i)),
                Err(_) => panic!("snowflake {s} of version 0 no longer reveals"),
            }
        }
        assert_eq!(out.reveal(one).ok(), Some((1, 5)));
    }
}
