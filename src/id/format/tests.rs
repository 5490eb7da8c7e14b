//! Whole-format tests: definitions, and simulated nodes that keep a
//! [`CounterRecord`] through restarts, midnights, DST days and clocks
//! stepped back, checking that no ID is ever issued twice.

use std::collections::HashSet;

use super::*;

fn ms(s: &str) -> i64 {
    s.parse::<jiff::Timestamp>().unwrap().as_millisecond()
}

fn compile(def: FormatDef) -> Result<Format, FormatError> {
    Format::compile(def, ms("2026-11-23T03:00:00Z"), LuaLimits::default())
}

fn day_format(zone: &str, template: &str) -> Format {
    let def = FormatDef::template("orders", template, zone, Reset::Day)
        .stamped(ms("2026-01-01T12:00:00Z"))
        .unwrap();
    compile(def).unwrap()
}

/// A node as the modes layer will run it: the record is "durable", a
/// block is reserved (record written) before its values are used, and a
/// restart forgets everything but the record.
struct SimNode<'a> {
    format: &'a Format,
    ids: NodeIds,
    record: Option<CounterRecord>,
    block: Option<(CounterBlock, u64)>,
    block_size: u64,
}

impl<'a> SimNode<'a> {
    fn new(format: &'a Format, ids: NodeIds, block_size: u64) -> Self {
        SimNode {
            format,
            ids,
            record: None,
            block: None,
            block_size,
        }
    }

    fn restart(&mut self) {
        self.block = None;
    }

    /// One ID at wall-clock `now`, or the error the caller would map.
    fn issue(&mut self, now: i64, bound: &Bound) -> Result<String, FormatError> {
        let d = self.format.decide(self.record.map(|r| r.period), now)?;
        assert!(d.may_issue(u64::MAX));
        let current = match self.block {
            Some((b, next)) if b.period == d.key && next <= b.last => Some((b, next)),
            _ => None,
        };
        let (block, value) = match current {
            Some(x) => x,
            None => {
                let (b, rec) = self
                    .format
                    .next_block(self.record.as_ref(), &d, self.block_size)?;
                self.record = Some(rec); // durable before use
                (b, b.first)
            }
        };
        self.block = Some((block, value + block.step));
        Ok(self
            .format
            .render(d.render_at_ms, value, self.ids, bound)?
            .text)
    }
}

#[test]
fn definitions_round_trip_through_json_and_toml() {
    let def = FormatDef {
        scope_params: vec!["biz".into()],
        description: "order numbers".into(),
        ..FormatDef::template(
            "orders",
            "{yyyy}{MM}{dd}{param:biz:2}{node:2}{seq:6}",
            "Asia/Shanghai",
            Reset::Day,
        )
    }
    .stamped(ms("2026-11-23T03:00:00Z"))
    .unwrap();
    assert_eq!(def.origin_year, Some(2026));
    let json = serde_json::to_string(&def).unwrap();
    assert_eq!(serde_json::from_str::<FormatDef>(&json).unwrap(), def);
    let toml_text = toml::to_string(&def).unwrap();
    assert_eq!(toml::from_str::<FormatDef>(&toml_text).unwrap(), def);
    let minimal: FormatDef = toml::from_str("name = \"x\"\ntemplate = \"{seq:4}\"\n").unwrap();
    assert_eq!(
        (minimal.version, minimal.time_zone.as_str(), minimal.step),
        (1, "UTC", 1)
    );
    // The time zone is read as `time_zone` or, as every earlier release
    // wrote it, `zone`; it is stored as `zone` for one more release, so a
    // node of the release before (which refuses unknown keys in a stored
    // definition) reads what this one stores during a rolling upgrade.
    let old: FormatDef = serde_json::from_str(
        r#"{"version":1,"name":"o","template":"{yyyy}{seq:4}","zone":"Asia/Shanghai","reset":"year"}"#,
    )
    .unwrap();
    let new: FormatDef =
        toml::from_str("name = \"o\"\ntemplate = \"{yyyy}{seq:4}\"\ntime_zone = \"Asia/Shanghai\"\nreset = \"year\"\n")
            .unwrap();
    assert_eq!((old.time_zone.as_str(), &old), ("Asia/Shanghai", &new));
    let stored = serde_json::to_value(&new).unwrap();
    assert_eq!(stored["zone"], "Asia/Shanghai", "{stored}");
    assert!(stored.get("time_zone").is_none(), "{stored}");
    assert!(toml::from_str::<FormatDef>("name = \"x\"\ntemplat = \"{seq:4}\"\n").is_err());
    let lua: FormatDef =
        toml::from_str("name = \"o2o\"\nlua = \"...\"\nreset = \"900s\"\n").unwrap();
    assert_eq!(lua.reset, Some(Reset::Seconds(900)));
}

/// The valid day-reset template format the definition checks start from.
fn orders() -> FormatDef {
    FormatDef::template("orders", "{yyyy}{MM}{dd}{seq:4}", "UTC", Reset::Day)
}

/// The error compiling `def` gives (panics, failing the test, if it compiles).
fn compile_err(def: FormatDef) -> FormatError {
    compile(def).unwrap_err()
}

#[test]
fn definitions_with_a_bad_name_a_future_version_or_an_unknown_zone_are_refused() {
    let base = orders();
    assert!(matches!(
        compile_err(FormatDef {
            name: "Orders".into(),
            ..base.clone()
        }),
        FormatError::BadName(_)
    ));
    assert!(matches!(
        compile_err(FormatDef {
            version: 2,
            ..base.clone()
        }),
        FormatError::FutureVersion { version: 2, .. }
    ));
    assert!(matches!(
        compile_err(FormatDef {
            time_zone: "Europe/Nowhere".into(),
            ..base.clone()
        }),
        FormatError::Period(PeriodError::UnknownZone(_))
    ));
}

#[test]
fn definitions_need_exactly_one_source() {
    let base = orders();
    assert!(matches!(
        compile_err(FormatDef {
            preset: Some(PresetName::Idc),
            ..base.clone()
        }),
        FormatError::NoSource(_)
    ));
    assert!(matches!(
        compile_err(FormatDef {
            template: None,
            ..base.clone()
        }),
        FormatError::NoSource(_)
    ));
}

#[test]
fn counters_need_a_step_of_at_least_one_and_min_not_above_max() {
    let base = orders();
    assert!(matches!(
        compile_err(FormatDef {
            step: 0,
            ..base.clone()
        }),
        FormatError::BadCounter { .. }
    ));
    assert!(matches!(
        compile_err(FormatDef {
            min: Some(10),
            max: Some(5),
            ..base.clone()
        }),
        FormatError::BadCounter { .. }
    ));
}

#[test]
fn template_definition_errors_name_the_format_and_field() {
    let base = orders();
    let e = compile_err(FormatDef {
        max: Some(10_000),
        ..base.clone()
    });
    assert!(
        e.to_string().contains("orders") && e.to_string().contains("{seq:4}"),
        "{e}"
    );
    let e = compile_err(FormatDef {
        reset: Some(Reset::Hour),
        ..base.clone()
    });
    assert!(e.to_string().contains("missing {HH}"), "{e}");
    let e = compile_err(FormatDef {
        scope_params: vec!["app".into()],
        ..base.clone()
    });
    assert!(
        matches!(e, FormatError::BadScopeParam { ref param, .. } if param == "app"),
        "{e}"
    );
    assert!(matches!(
        compile_err(FormatDef {
            length: Some(12),
            ..base.clone()
        }),
        FormatError::NotApplicable {
            field: "length",
            ..
        }
    ));
}

#[test]
fn a_short_year_needs_a_stamped_origin_year() {
    // {yy} without a stamped origin year is refused; stamped it compiles.
    let yy = FormatDef::template("yy", "{yy}{MM}{dd}{seq:4}", "UTC", Reset::Day);
    assert!(matches!(
        compile_err(yy.clone()),
        FormatError::NoOriginYear(_)
    ));
    let f = compile(yy.stamped(ms("2026-11-23T03:00:00Z")).unwrap()).unwrap();
    assert_eq!(f.template().unwrap().year_window(), Some((2026, 2125)));
}

#[test]
fn a_template_counter_defaults_to_the_field_width_from_0_cluster_wide() {
    // Defaults: max from the field, min 0, cluster scope.
    let f = compile(orders()).unwrap();
    assert_eq!(
        f.counter(),
        CounterRange {
            min: 0,
            max: 9999,
            step: 1
        }
    );
    assert_eq!(f.scope(), Scope::Cluster);
}

fn lua_def(name: &str, code: &str) -> FormatDef {
    FormatDef {
        lua: Some(code.into()),
        template: None,
        reset: None,
        ..FormatDef::template(name, "", "UTC", Reset::Never)
    }
}

/// `create_id` of the rule the case of a code update repeating IDs used:
/// `L` and the counter, or the counter moved back by `back`.
fn l_rule(back: u64) -> String {
    format!(
        "function min_counter() return 0 end\nfunction max_counter() return 9999 end\nfunction reset_seconds() return 0 end\nfunction create_id(counter, now, salt) return string.format('L%06d', counter - {back}) end\n"
    )
}

/// An edit of a definition, as a test case.
type Change = fn(&mut FormatDef);

/// A format's rendering is frozen: every field that decides how a counter
/// value renders, or which period it is in, is refused by name; only the
/// description and a larger max pass, and restating a default is no change.
#[test]
fn a_formats_rendering_is_frozen_field_by_field() {
    let t = |f: fn(&mut FormatDef)| {
        let mut d = FormatDef::template("orders", "{yyyy}{MM}{dd}{seq:4}", "UTC", Reset::Day);
        d.origin_year = Some(2026);
        f(&mut d);
        d
    };
    let old = t(|d| d.max = Some(5000));
    let allowed: [Change; 5] = [
        |d| d.max = Some(5000),
        |d| d.description = "order numbers".into(),
        |d| d.max = Some(9999),
        |d| d.max = None, // the field's widest, 9999: a larger max
        |d| d.min = Some(0),
    ];
    for change in allowed {
        let mut new = old.clone();
        change(&mut new);
        assert_eq!(old.check_update(&new), Ok(()), "{new:?}");
    }
    let refused: [(Change, &str); 10] = [
        (|d| d.name = "orders2".into(), "name"),
        (
            |d| d.template = Some("X{yyyy}{MM}{dd}{seq:4}".into()),
            "template",
        ),
        (|d| d.time_zone = "Asia/Shanghai".into(), "time_zone"),
        (|d| d.reset = Some(Reset::Hour), "reset"),
        (|d| d.min = Some(1), "min"),
        (|d| d.max = Some(4999), "max"),
        (|d| d.step = 2, "step"),
        (|d| d.scope_params = vec!["shop".into()], "scope_params"),
        (|d| d.origin_year = Some(2027), "origin_year"),
        (
            |d| {
                d.template = None;
                d.preset = Some(PresetName::Idc);
            },
            "kind (template, lua or preset)",
        ),
    ];
    for (change, field) in refused {
        let mut new = old.clone();
        change(&mut new);
        let e = old.check_update(&new).unwrap_err();
        assert!(
            matches!(&e, FormatError::Immutable { field: f, .. } if *f == field),
            "{field}: {e:?}"
        );
        let text = e.to_string();
        assert!(
            text.contains(field) && text.contains("create a new format (e.g. orders-v2)"),
            "{text}"
        );
    }
}

/// The same rule for presets and Lua rules: the other preset, a smaller
/// uniq64 max, the code and the declared length are refused; a larger max
/// passes only if the new definition compiles.
#[test]
fn presets_and_lua_rules_are_frozen_too() {
    let mut old = FormatDef::template("orders", "{yyyy}{MM}{dd}{seq:4}", "UTC", Reset::Day);
    old.origin_year = Some(2026);
    // A larger max must still fit its field: the new definition does not
    // compile, so no path stores it.
    let too_wide = FormatDef {
        max: Some(10_000),
        ..old.clone()
    };
    assert_eq!(old.check_update(&too_wide), Ok(()));
    assert!(matches!(
        compile(too_wide),
        Err(FormatError::Template { .. })
    ));
    // Presets: the other preset, and uniq64's max only grows.
    let mut idc = old.clone();
    idc.template = None;
    idc.reset = None;
    idc.preset = Some(PresetName::Idc);
    let uniq = FormatDef {
        preset: Some(PresetName::Uniq64),
        ..idc.clone()
    };
    assert!(matches!(
        idc.check_update(&uniq),
        Err(FormatError::Immutable {
            field: "preset",
            ..
        })
    ));
    let smaller = FormatDef {
        max: Some(1000),
        ..uniq.clone()
    };
    assert!(matches!(
        uniq.check_update(&smaller),
        Err(FormatError::Immutable { field: "max", .. })
    ));
    assert_eq!(smaller.check_update(&uniq), Ok(()));
    // Lua: the code, and the declared length.
    let lua = lua_def("l", &l_rule(0));
    let desc = FormatDef {
        description: "x".into(),
        ..lua.clone()
    };
    assert_eq!(lua.check_update(&desc), Ok(()));
    assert!(matches!(
        lua.check_update(&lua_def("l", &l_rule(1))),
        Err(FormatError::Immutable { field: "lua", .. })
    ));
    let length = FormatDef {
        length: Some(7),
        ..lua.clone()
    };
    assert!(matches!(
        lua.check_update(&length),
        Err(FormatError::Immutable {
            field: "length",
            ..
        })
    ));
}

/// The reported case: a Lua rule's code replaced by one rendering
/// `counter - 150` would hand out 150 IDs again; the update is refused,
/// and the counter going on under the rule in use repeats nothing.
#[test]
fn a_lua_code_update_that_would_repeat_ids_is_refused() {
    let old = compile(lua_def("l", &l_rule(0))).unwrap();
    let b = old.bind([]).unwrap();
    let mut node = SimNode::new(&old, NodeIds::default(), 50);
    let mut seen = HashSet::new();
    let t = ms("2026-11-23T03:00:00Z");
    for i in 0..200 {
        assert!(seen.insert(node.issue(t + i, &b).unwrap()));
    }
    let moved = lua_def("l", &l_rule(150));
    // It loads and passes the rule's own checks: only the update rule
    // stands between it and repeated IDs.
    let new = compile(moved.clone()).unwrap();
    let e = old.def().check_update(new.def()).unwrap_err();
    assert!(
        matches!(&e, FormatError::Immutable { field: "lua", .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("l-v2"), "{e}");
    // What it would have done: the next 200 IDs of the new code repeat.
    let record = node.record;
    let mut under_new = SimNode::new(&new, NodeIds::default(), 50);
    under_new.record = record;
    let repeats = (0..200)
        .filter(|i| seen.contains(&under_new.issue(t + 300 + i, &b).unwrap()))
        .count();
    assert_eq!(repeats, 150);
    for i in 0..200 {
        assert!(seen.insert(node.issue(t + 300 + i, &b).unwrap()));
    }
}

#[test]
fn a_restart_in_the_same_period_continues_and_after_midnight_starts_fresh() {
    // CosId#748: the reset must follow the stored period, not the clock.
    let f = day_format("Asia/Shanghai", "{yyyy}{MM}{dd}{seq:6}");
    let b = f.bind([]).unwrap();
    let mut node = SimNode::new(&f, NodeIds::default(), 100);
    let mut seen = HashSet::new();
    let t = ms("2026-11-23T15:59:00Z"); // 23:59 in Shanghai
    for i in 0..150 {
        assert!(seen.insert(node.issue(t + i, &b).unwrap()));
    }
    node.restart(); // the rest of the block (50) is wasted, never reused
    let id = node.issue(t + 200, &b).unwrap();
    assert_eq!(id, "20261123000200");
    assert!(seen.insert(id));
    node.restart();
    // After local midnight: a new day starts at the minimum.
    let id = node.issue(ms("2026-11-23T16:00:00Z"), &b).unwrap();
    assert_eq!(id, "20261124000000");
    assert!(seen.insert(id));
}

#[test]
fn a_clock_stepped_back_across_midnight_stays_in_the_new_day() {
    let f = day_format("America/New_York", "{yyyy}{MM}{dd}{HH}{mm}{seq:4}");
    let b = f.bind([]).unwrap();
    let mut node = SimNode::new(&f, NodeIds::default(), 10);
    let mut seen = HashSet::new();
    let before = ms("2026-11-24T04:59:00Z"); // 23:59 EST on the 23rd
    let after = ms("2026-11-24T05:00:00Z"); // midnight EST, the 24th
    for i in 0..100 {
        assert!(seen.insert(node.issue(before + i, &b).unwrap()));
    }
    for i in 0..10 {
        assert!(seen.insert(node.issue(after + i, &b).unwrap()));
    }
    // The clock steps back a minute, and a restart happens too.
    node.restart();
    for i in 0..30 {
        let id = node.issue(before + 1000 + i, &b).unwrap();
        assert!(id.starts_with("202611240000"), "held in the new day: {id}");
        assert!(seen.insert(id.clone()), "{id} repeated");
    }
    // Why the held period renders at its own first instant: the first
    // held counter (10) rendered at the raw wall clock is an ID the 23rd
    // already issued.
    let raw = f
        .render(before + 1000, 10, NodeIds::default(), &b)
        .unwrap()
        .text;
    assert!(
        seen.contains(&raw),
        "rendering at the wall clock would repeat {raw}"
    );
}

#[test]
fn dst_days_in_new_york_and_midnights_in_shanghai_never_repeat_an_id() {
    for (zone, template, reset, from, to) in [
        (
            "America/New_York",
            "{yyyy}{MM}{dd}{HH}{seq:3}",
            Reset::Hour,
            "2026-11-01T03:00:00Z",
            "2026-11-01T09:00:00Z",
        ),
        (
            "America/New_York",
            "{yyyy}{MM}{dd}{HH}{seq:3}",
            Reset::Hour,
            "2026-03-08T05:00:00Z",
            "2026-03-08T09:00:00Z",
        ),
        (
            "America/New_York",
            "{yyyy}{MM}{dd}{HH}{mm}{seq:3}",
            Reset::Seconds(7200),
            "2026-11-01T04:30:00Z",
            "2026-11-01T07:30:00Z",
        ),
        (
            "America/New_York",
            "{yy}{ddd}{seq:4}",
            Reset::Day,
            "2026-10-31T20:00:00Z",
            "2026-11-02T08:00:00Z",
        ),
        (
            "Asia/Shanghai",
            "{yyyy}{MM}{dd}{seq:4}",
            Reset::Day,
            "2026-11-23T14:00:00Z",
            "2026-11-24T18:00:00Z",
        ),
    ] {
        let def = FormatDef::template("t", template, zone, reset)
            .stamped(ms("2026-01-01T12:00:00Z"))
            .unwrap();
        let f = compile(def).unwrap();
        let b = f.bind([]).unwrap();
        let mut node = SimNode::new(&f, NodeIds::default(), 7);
        let mut seen = HashSet::new();
        let (mut t, end) = (ms(from), ms(to));
        let mut n = 0;
        while t < end {
            let id = node.issue(t, &b).unwrap();
            assert!(seen.insert(id.clone()), "{zone} {reset}: {id} repeated");
            n += 1;
            if n % 5 == 0 {
                node.restart();
            }
            t += 60_000; // one ID a minute: the counter fits each period
        }
        assert!(seen.len() > 100);
    }
}

#[test]
fn three_nodes_never_share_an_id_per_node_or_cluster_wide() {
    // Per node: each node its own counter, the node id in the ID.
    let f = day_format("Asia/Shanghai", "{yyyy}{MM}{dd}{node:2}{seq:5}");
    assert_eq!(f.scope(), Scope::Node);
    let b = f.bind([]).unwrap();
    let mut seen = HashSet::new();
    let mut nodes: Vec<SimNode> = (1..=3)
        .map(|n| {
            SimNode::new(
                &f,
                NodeIds {
                    node: Some(n),
                    token: None,
                },
                50,
            )
        })
        .collect();
    let t = ms("2026-11-23T10:00:00Z");
    for i in 0..600 {
        let id = nodes[i % 3].issue(t + i as i64, &b).unwrap();
        assert!(seen.insert(id));
    }
    // Cluster-wide: one shared record, blocks taken in turn.
    let f = day_format("Asia/Shanghai", "{yyyy}{MM}{dd}{seq:6}");
    assert_eq!(f.scope(), Scope::Cluster);
    let b = f.bind([]).unwrap();
    let mut shared: Option<CounterRecord> = None;
    let mut seen = HashSet::new();
    for round in 0..30 {
        for _node in 0..3 {
            let d = f.decide(shared.map(|r| r.period), t + round).unwrap();
            let (block, rec) = f.next_block(shared.as_ref(), &d, 10).unwrap();
            shared = Some(rec);
            let mut v = block.first;
            while v <= block.last {
                let id = f
                    .render(d.render_at_ms, v, NodeIds::default(), &b)
                    .unwrap()
                    .text;
                assert!(seen.insert(id));
                v += block.step;
            }
        }
    }
    assert_eq!(seen.len(), 900);
}

#[test]
fn an_exhausted_counter_names_the_format_and_the_next_period() {
    let def = FormatDef {
        max: Some(3),
        step: 1,
        ..FormatDef::template("tiny", "{yyyy}{MM}{dd}{seq:2}", "Asia/Shanghai", Reset::Day)
    };
    let f = compile(def).unwrap();
    let b = f.bind([]).unwrap();
    let mut node = SimNode::new(&f, NodeIds::default(), 2);
    let t = ms("2026-11-23T03:00:00Z");
    for i in 0..4 {
        node.issue(t + i, &b).unwrap();
    }
    let err = node.issue(t + 5, &b).unwrap_err();
    assert!(
        matches!(err, FormatError::Exhausted { ref format, next_start_ms: Some(n), .. }
        if format == "tiny" && n == ms("2026-11-23T16:00:00Z")),
        "{err:?}"
    );
    assert!(err.to_string().contains("2026-11-23T16:00:00Z"), "{err}");
    // Next day it works again.
    assert_eq!(
        node.issue(ms("2026-11-23T16:00:00Z"), &b).unwrap(),
        "2026112400"
    );
    // Steps: values min, min+step, ... never above max.
    let d = f.decide(None, t).unwrap();
    let range = CounterRange {
        min: 1,
        max: 10,
        step: 4,
    };
    let (blk, rec) = CounterRecord::next_block(None, &d, &range, 100, "x", None).unwrap();
    assert_eq!((blk.first, blk.last, blk.len(), rec.last), (1, 9, 3, 9));
    assert!(CounterRecord::next_block(
        Some(&rec),
        &f.decide(Some(rec.period), t).unwrap(),
        &range,
        1,
        "x",
        None
    )
    .is_err());
    assert_eq!(range.capacity(), 3);
    // A decision not made on the record is refused, not guessed at: a
    // "first" decision with a record stored would restart the counter.
    let first = f.decide(None, t).unwrap();
    assert!(matches!(
        CounterRecord::next_block(Some(&rec), &first, &range, 1, "x", None),
        Err(FormatError::PeriodMismatch { .. })
    ));
    let later = f
        .decide(Some(rec.period), ms("2026-11-24T16:00:00Z"))
        .unwrap();
    assert!(CounterRecord::next_block(None, &later, &range, 1, "x", None).is_err());
}

#[test]
fn scope_parameters_must_be_rendered_and_are_validated() {
    let def = FormatDef {
        scope_params: vec!["biz".into()],
        ..FormatDef::template(
            "po",
            "{param:biz:3:alnum}{yyyy}{MM}{dd}{seq:4}",
            "UTC",
            Reset::Day,
        )
    };
    let f = compile(def).unwrap();
    let b = f.bind([("biz", "A01")]).unwrap();
    assert_eq!(b.scope_key(), "biz=A01");
    let e = f.bind([("biz", "a01")]).unwrap_err();
    assert!(e.to_string().contains("\"biz\""), "{e}");
    assert!(matches!(
        f.bind([]),
        Err(FormatError::Render(RenderError::MissingParam { .. }))
    ));
    // The node check renders past the parameters to the node field.
    let def = FormatDef::template("pn", "{param:b:2}{node:2}{seq:2}", "UTC", Reset::Never);
    let f = compile(def).unwrap();
    assert!(matches!(
        f.check_node(NodeIds::default()),
        Err(FormatError::BadNode { .. })
    ));
    assert!(f
        .check_node(NodeIds {
            node: Some(42),
            token: None
        })
        .is_ok());
}

#[test]
fn idc_preset_renders_parses_and_decodes() {
    let def = FormatDef {
        preset: Some(PresetName::Idc),
        template: None,
        reset: None,
        ..FormatDef::template("idc", "", "UTC", Reset::Never)
    };
    let f = compile(def).unwrap();
    assert_eq!(
        (f.reset(), f.scope(), f.counter().max),
        (Reset::Seconds(1), Scope::Node, 9999)
    );
    let b = f.bind([("type", "1"), ("route", "00")]).unwrap();
    let r = f
        .render(
            ms("2026-11-23T00:00:00Z"),
            9998,
            NodeIds {
                node: Some(1),
                token: None,
            },
            &b,
        )
        .unwrap();
    assert_eq!(r.text, "1795392000999801100");
    let n = r.number.unwrap();
    assert_eq!(
        Idc::decode(n).unwrap().to_string(),
        "1795392000-9998-01-1-00"
    );
    let p = f.parse(&r.text).unwrap();
    assert_eq!(
        (p.unix_s, p.seq, p.node),
        (Some(1_795_392_000), 9998, Some(1))
    );
    assert!(f
        .check_node(NodeIds {
            node: Some(100),
            token: None
        })
        .is_err());
    assert!(f.check_node(NodeIds::default()).is_err());
    assert!(f
        .check_node(NodeIds {
            node: Some(99),
            token: None
        })
        .is_ok());
    let ny = FormatDef {
        preset: Some(PresetName::Idc),
        template: None,
        reset: None,
        ..FormatDef::template("idc", "", "America/New_York", Reset::Never)
    };
    assert!(matches!(
        compile(ny),
        Err(FormatError::ClockGoesBack { .. })
    ));
}

#[test]
fn uniq64_preset_renders_and_parses_back() {
    let def = FormatDef {
        preset: Some(PresetName::Uniq64),
        template: None,
        reset: None,
        ..FormatDef::template("u", "", "Asia/Shanghai", Reset::Never)
    };
    let f = compile(def).unwrap();
    assert_eq!((f.reset(), f.scope()), (Reset::Day, Scope::Node));
    let ids = NodeIds {
        node: None,
        token: Some(77),
    };
    f.check_node(ids).unwrap();
    assert!(f
        .check_node(NodeIds {
            node: None,
            token: Some(4096)
        })
        .is_err());
    let b = f.bind([]).unwrap();
    let r = f
        .render(ms("2026-11-23T16:30:00Z"), 123_456, ids, &b)
        .unwrap();
    let u = Uniq64::decode(r.number.unwrap()).unwrap();
    assert_eq!(
        (u.full_year(), u.month, u.day, u.hour, u.token, u.serial),
        (2026, 11, 24, 0, 77, 123_456)
    );
    let p = f.parse(&r.text).unwrap();
    assert_eq!(
        (p.year, p.day, p.token, p.seq),
        (Some(2026), Some(24), Some(77), 123_456)
    );
    assert!(f.parse("12x").is_err());
}

#[test]
fn lua_formats_take_their_bounds_from_the_rule_and_a_salt() {
    let rule = "function min_counter() return 1 end\nfunction max_counter() return 999 end\nfunction reset_seconds() return 86400 end\nfunction create_id(counter, now, salt)\n  return string.format('%s%04d%02d%02d%03d', salt or 'X', now:year(), now:month(), now:day(), counter)\nend\n";
    let def = FormatDef {
        lua: Some(rule.into()),
        template: None,
        reset: None,
        scope_params: vec!["app_name".into()],
        ..FormatDef::template("o2o", "", "Asia/Shanghai", Reset::Never)
    };
    let f = compile(def.clone()).unwrap();
    assert_eq!(
        (f.reset(), f.counter().min, f.counter().max),
        (Reset::Seconds(86_400), 1, 999)
    );
    assert_eq!(f.scope(), Scope::Cluster);
    let b = f.bind([("app_name", "shop"), ("salt", "A")]).unwrap();
    assert_eq!(b.scope_key(), "app_name=shop");
    let r = f
        .render(ms("2026-11-23T03:00:00Z"), 5, NodeIds::default(), &b)
        .unwrap();
    assert_eq!((r.text.as_str(), r.number), ("A20261123005", None));
    assert!(matches!(
        f.parse("A20261123005"),
        Err(FormatError::Parse(ParseError::NotParseable(_)))
    ));
    assert!(f.bind([("salt", "A")]).is_err(), "app_name missing");
    assert!(f.bind([("app_name", "shop"), ("x", "1")]).is_err());
    let e = compile(FormatDef {
        reset: Some(Reset::Day),
        ..def
    })
    .unwrap_err();
    assert!(matches!(
        e,
        FormatError::NotApplicable { field: "reset", .. }
    ));
}

#[test]
fn an_origin_year_out_of_range_is_refused_naming_the_range() {
    for year in [i32::MAX, i32::MIN, 1969, 10_000] {
        let mut yy = FormatDef::template("yy", "{yy}{MM}{dd}{seq:4}", "UTC", Reset::Day);
        yy.origin_year = Some(year);
        let err = compile_err(yy);
        assert!(
            matches!(err, FormatError::BadOriginYear { year: y, .. } if y == year),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.contains(&format!("origin_year = {year}")) && text.contains("from 1970 to 9999"),
            "{text}"
        );
    }
    for year in [1970, 2026, 9999] {
        let mut yy = FormatDef::template("yy", "{yy}{MM}{dd}{seq:4}", "UTC", Reset::Day);
        yy.origin_year = Some(year);
        assert!(compile(yy).is_ok(), "{year}");
    }
}

/// A custom template whose periods a DST fall-back crosses is refused like
/// the `idc` preset, by the same rule and naming the zone, the change and
/// what to do; the same template in UTC, or with periods the fall-back
/// stays inside, compiles.
#[test]
fn templates_whose_periods_a_dst_fall_back_crosses_are_refused_like_idc() {
    let def = |zone: &str, reset| FormatDef::template("stamp", "{unix_s}{seq:4}", zone, reset);
    let e = compile_err(def("America/New_York", Reset::Seconds(1)));
    assert!(matches!(e, FormatError::ClockGoesBack { .. }), "{e}");
    let text = e.to_string();
    for part in [
        "America/New_York",
        "3600 s",
        "2027-11-07",
        "UTC",
        "\"stamp\"",
    ] {
        assert!(text.contains(part), "{part} missing from: {text}");
    }
    assert_eq!(e.kind(), crate::id::ErrorKind::BadRequest);
    let hourly = FormatDef::template(
        "h",
        "{yyyy}{MM}{dd}{HH}{mm}{seq:3}",
        "America/New_York",
        Reset::Seconds(1800),
    );
    assert!(matches!(
        compile_err(hourly),
        FormatError::ClockGoesBack { .. }
    ));
    compile(def("UTC", Reset::Seconds(1))).unwrap();
    compile(def("Asia/Shanghai", Reset::Seconds(1))).unwrap();
    let idc_ny = FormatDef {
        preset: Some(PresetName::Idc),
        template: None,
        reset: None,
        ..FormatDef::template("idc", "", "America/New_York", Reset::Never)
    };
    assert!(matches!(
        compile_err(idc_ny),
        FormatError::ClockGoesBack { .. }
    ));
}

/// `hide = true` compiles a template as if each `{seq:N}` were
/// `{seq:N:hidden}` (docs/SAFETY-RULES-18-25.md, rule 22, "`hide = true` hides
/// every counter of a format"), and is frozen with the template: a format
/// that issued plain IDs never starts showing hidden ones, or back.
#[test]
fn hide_true_hides_every_counter_and_is_frozen() {
    let mut plain = FormatDef::template("inv", "INV{yyyy}{seq:8}", "UTC", Reset::Year);
    plain.origin_year = Some(2026);
    let hidden = FormatDef {
        hide: true,
        ..plain.clone()
    };
    let explicit = FormatDef {
        template: Some("INV{yyyy}{seq:8:hidden}".into()),
        ..plain.clone()
    };
    let (h, e, p) = (
        compile(hidden.clone()).unwrap(),
        compile(explicit).unwrap(),
        compile(plain.clone()).unwrap(),
    );
    let ht = h.template().expect("a template");
    assert!(ht.hidden_seq(), "hide = true must hide the counter");
    assert_eq!(ht.seq_max(), 9_999_999, "one digit is the key version");
    assert_eq!(h.counter().max, e.counter().max);
    assert_eq!(h.counter().max, 9_999_999);
    assert!(!p.template().unwrap().hidden_seq());
    assert!(hidden.hides() && !plain.hides());
    assert_eq!(hidden.hide_key_id(), "inv");
    // Stored and read back: the flag survives; a definition without it
    // reads as plain.
    let json = serde_json::to_string(&hidden).unwrap();
    assert!(json.contains("\"hide\":true"), "{json}");
    assert_eq!(serde_json::from_str::<FormatDef>(&json).unwrap(), hidden);
    let old_json = serde_json::to_string(&plain).unwrap();
    assert!(!old_json.contains("hide"), "{old_json}");
    // Frozen both ways, and its key with it.
    for (from, to) in [(&plain, &hidden), (&hidden, &plain)] {
        let err = from.check_update(to).unwrap_err();
        assert!(
            matches!(err, FormatError::Immutable { field: "hide", .. }),
            "{err:?}"
        );
    }
    let rekeyed = FormatDef {
        hide_key: Some("other".into()),
        ..hidden.clone()
    };
    assert!(matches!(
        hidden.check_update(&rekeyed),
        Err(FormatError::Immutable {
            field: "hide_key",
            ..
        })
    ));
    let described = FormatDef {
        description: "invoices".into(),
        ..hidden.clone()
    };
    assert_eq!(hidden.check_update(&described), Ok(()));
}

/// A counter too narrow for FF1, a Lua rule and `uniq64` cannot be
/// hidden: each is refused at definition time, naming what to do.
#[test]
fn hide_true_refuses_narrow_counters_and_other_kinds() {
    let narrow = FormatDef {
        hide: true,
        ..orders()
    };
    let err = compile_err(narrow);
    let text = err.to_string();
    assert!(
        text.contains("hide = true") && text.contains("7 to 18"),
        "{text}"
    );
    let mut idc = orders();
    idc.template = None;
    idc.reset = None;
    idc.preset = Some(PresetName::Idc);
    idc.hide = true;
    let text = compile_err(idc).to_string();
    assert!(text.contains("hide = true"), "idc's seq:4: {text}");
    let mut uniq = orders();
    uniq.template = None;
    uniq.reset = None;
    uniq.preset = Some(PresetName::Uniq64);
    uniq.hide = true;
    let err = compile_err(uniq);
    assert!(
        matches!(err, FormatError::NotApplicable { field: "hide", .. }),
        "{err:?}"
    );
    let lua = FormatDef {
        hide: true,
        ..lua_def("l", &l_rule(0))
    };
    let err = compile_err(lua);
    assert!(
        matches!(err, FormatError::NotApplicable { field: "hide", .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("drop hide"), "{err}");
}
