//! `[layout]` as written in the file, and the hiding of snowflake IDs
//! (`hide`, `hide_key`, `hide_version_bits`): the variant, and the
//! effective layout the generator composes internal IDs under.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{invalid, ConfigError};
use crate::id::hide::{HideKey, SnowflakeHider, SnowflakeHiding};
use crate::id::Layout;

/// `layout.hide_version_bits` when not set: four keys over a layout's life.
pub const DEFAULT_HIDE_VERSION_BITS: u8 = 2;

/// `[layout]`: a preset, optionally with individual widths overridden.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LayoutSection {
    /// `twitter` (41/5/5/12 of 1 ms), `sonyflake` (39 bits of 10 ms, 8/8
    /// machine, 8 sequence) or `js53` (below 2^53).
    pub preset: String,
    /// RFC 3339 instant that time zero stands for.
    pub epoch: String,
    /// Length of one time unit (1 ms to 1 s); overrides the preset.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub time_unit: Option<Duration>,
    /// Width of the time field; overrides the preset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_bits: Option<u8>,
    /// Width of the datacenter field; overrides the preset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub datacenter_bits: Option<u8>,
    /// Width of the worker field; overrides the preset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_bits: Option<u8>,
    /// Width of the sequence field; overrides the preset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence_bits: Option<u8>,
    /// Hide snowflake IDs (issue 23): empty (off, the default),
    /// `sortable` (time kept in clear, datacenter, worker and sequence
    /// permuted per time unit) or `opaque` (the whole ID permuted). Part of
    /// the cluster layout: set it before the cluster issues its first ID.
    pub hide: String,
    /// The hide key id the layout's IDs are hidden with (`idgen admin
    /// keys create ID`); required with `hide`.
    pub hide_key: String,
    /// Bits of key version in a hidden ID, 1 to 8: the layout can have
    /// `2^hide_version_bits` keys over its life. Sortable takes them from
    /// the sequence (fewer IDs per time unit), opaque from the time (the
    /// layout runs out `2^hide_version_bits` times sooner).
    pub hide_version_bits: u8,
}

impl LayoutSection {
    /// The preset name, with `+overrides` when individual widths or the
    /// time unit override it.
    pub fn preset_name(&self) -> String {
        let l = self;
        let overridden = l.time_unit.is_some()
            || l.time_bits.is_some()
            || l.datacenter_bits.is_some()
            || l.worker_bits.is_some()
            || l.sequence_bits.is_some();
        if overridden {
            format!("{}+overrides", l.preset)
        } else {
            l.preset.clone()
        }
    }
}

impl Default for LayoutSection {
    fn default() -> Self {
        Self {
            preset: "twitter".into(),
            epoch: "2024-01-01T00:00:00Z".into(),
            time_unit: None,
            time_bits: None,
            datacenter_bits: None,
            worker_bits: None,
            sequence_bits: None,
            hide: String::new(),
            hide_key: String::new(),
            hide_version_bits: DEFAULT_HIDE_VERSION_BITS,
        }
    }
}

/// A hidden snowflake layout, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutHide {
    /// Sortable or opaque.
    pub hiding: SnowflakeHiding,
    /// The hide key id.
    pub key_id: String,
    /// Bits of key version (1 to 8).
    pub version_bits: u32,
    /// The layout the generator composes internal IDs under
    /// ([`SnowflakeHider::generator_spec`]).
    pub internal: Layout,
}

impl LayoutHide {
    /// The variant's name as configured.
    pub fn variant(&self) -> &'static str {
        match self.hiding {
            SnowflakeHiding::Sortable => "sortable",
            SnowflakeHiding::Opaque => "opaque",
        }
    }

    /// How the setting is recorded with the layout (state file, Consul):
    /// any change of it is a layout change.
    pub fn record_text(&self) -> String {
        format!(
            "{} with key {:?}, {} version bits",
            self.variant(),
            self.key_id,
            self.version_bits
        )
    }
}

impl LayoutSection {
    /// The hiding of `layout` (the public layout this section describes),
    /// checked against `now_ms`: `None` when `hide` is empty. Refuses an
    /// unknown variant, a missing key id, a version width out of range, a
    /// layout too narrow to hide, and an effective layout with no time
    /// left (opaque takes its version bits from the time).
    pub fn hide_settings(
        &self,
        layout: &Layout,
        now_ms: u64,
    ) -> Result<Option<LayoutHide>, ConfigError> {
        let hiding = match self.hide.as_str() {
            "" => {
                if !self.hide_key.is_empty() {
                    return Err(invalid("layout.hide_key", "is set but layout.hide is not; set layout.hide = \"sortable\" or \"opaque\", or remove hide_key"));
                }
                return Ok(None);
            }
            "sortable" => SnowflakeHiding::Sortable,
            "opaque" => SnowflakeHiding::Opaque,
            other => {
                return Err(invalid(
                    "layout.hide",
                    format!("{other:?} is not a hiding variant; use \"sortable\" (time kept, order kept) or \"opaque\" (everything hidden, no order), or leave it empty"),
                ))
            }
        };
        if self.hide_key.trim().is_empty() {
            return Err(invalid(
                "layout.hide_key",
                "is required with layout.hide: name the hide key (`idgen admin keys create ID`)",
            ));
        }
        let version_bits = u32::from(self.hide_version_bits);
        if !(1..=8).contains(&version_bits) {
            return Err(invalid(
                "layout.hide_version_bits",
                format!("{version_bits} is out of range; use 1 to 8"),
            ));
        }
        // Widths checked with a throwaway key: the real keys come later.
        let probe = HideKey::new(0, [0; 32]);
        SnowflakeHider::new(&[&probe], 0, layout, hiding, version_bits)
            .map_err(|e| invalid("layout.hide", e.to_string()))?;
        let spec = SnowflakeHider::generator_spec(layout.spec(), hiding, version_bits);
        let internal = spec.validate(now_ms).map_err(|e| {
            invalid(
                "layout.hide",
                format!(
                    "the {} layout's effective layout ({} version bits taken) is refused: {e}",
                    self.hide, version_bits
                ),
            )
        })?;
        Ok(Some(LayoutHide {
            hiding,
            key_id: self.hide_key.clone(),
            version_bits,
            internal,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::{Preset, DEFAULT_EPOCH_MS};

    const NOW: u64 = 1_790_000_000_000;

    fn section(hide: &str, bits: u8) -> (LayoutSection, Layout) {
        let s = LayoutSection {
            hide: hide.into(),
            hide_key: "k".into(),
            hide_version_bits: bits,
            ..LayoutSection::default()
        };
        let layout = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(NOW)
            .unwrap();
        (s, layout)
    }

    #[test]
    fn opaque_hiding_shortens_the_time_left() {
        let (s, layout) = section("opaque", 2);
        let hide = s.hide_settings(&layout, NOW).unwrap().unwrap();
        let plain = layout.years_left(NOW);
        let hidden = hide.internal.years_left(NOW);
        // 2^41 ms from 2024 is 69 years; a quarter of it is about 17.
        assert!(hidden < plain / 3.0, "{hidden} vs {plain}");
        assert_eq!(hide.internal.total_bits(), layout.total_bits() - 2);
        // Sortable keeps the time: the same end, fewer sequence values.
        let (s, layout) = section("sortable", 2);
        let hide = s.hide_settings(&layout, NOW).unwrap().unwrap();
        assert_eq!(hide.internal.end_ms(), layout.end_ms());
        assert_eq!(hide.internal.spec().sequence_bits, 10);
    }

    #[test]
    fn an_opaque_layout_with_no_time_left_is_refused() {
        // 8 version bits off 41: 33 bits of ms from 2024 ended in 2024.
        let (s, layout) = section("opaque", 8);
        let err = s.hide_settings(&layout, NOW).unwrap_err().to_string();
        assert!(
            err.contains("layout.hide") && err.contains("time bits ran out"),
            "{err}"
        );
    }

    #[test]
    fn bad_hide_settings_name_the_key() {
        for (hide, key, bits, want) in [
            ("sideways", "k", 2, "layout.hide"),
            ("sortable", "", 2, "layout.hide_key"),
            ("opaque", "k", 9, "layout.hide_version_bits"),
            ("", "k", 2, "layout.hide_key"),
        ] {
            let (mut s, layout) = section(hide, bits);
            s.hide_key = key.into();
            let err = s.hide_settings(&layout, NOW).unwrap_err().to_string();
            assert!(err.contains(want), "{hide}/{key}/{bits}: {err}");
        }
        let (s, layout) = section("", 2);
        let mut s = s;
        s.hide_key.clear();
        assert_eq!(s.hide_settings(&layout, NOW).unwrap(), None);
    }
}
