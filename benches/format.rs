//! Formatted IDs in process, on one thread: the pure rendering cost per ID
//! (no store; counters come from a local loop).
//!
//! `cargo bench --bench format`
//!
//! - `template_render`: one ID from `{yyyy}{MM}{dd}{node:2}{seq:6}` in
//!   Asia/Shanghai, the zone conversion done per ID (target <= 300 ns).
//! - `template_render_batch_fields`: the same with the time fields computed
//!   once per batch, as a `count` > 1 call can.
//! - `template_render_check_params`: a longer template with a parameter
//!   and a Luhn digit.
//! - `lua_create_id`: a daily Lua rule, one `create_id` call per ID under
//!   the sandbox's budget hook (target <= 3 us).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use idgen::id::format::{CivilFields, Format, FormatDef, LuaLimits, NodeIds, Reset, Zone};

const NOW_MS: i64 = 1_795_403_045_000; // 2026-11-23T03:04:05Z

const DAILY_LUA_RULE: &str = r#"
function min_counter() return 0 end
function max_counter() return 9999 end
function reset_seconds() return 86400 end
function create_id(counter, now, salt)
    local seq = counter:generate_counter()
    return string.format("%04d%02d%02d%04d", now:year(), now:month(), now:day(), seq)
end
"#;

fn template(name: &str, src: &str) -> Format {
    let def = FormatDef::template(name, src, "Asia/Shanghai", Reset::Day)
        .stamped(NOW_MS)
        .expect("stamp");
    Format::compile(def, NOW_MS, LuaLimits::default()).expect("format")
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("format");
    g.throughput(Throughput::Elements(1));
    let node = NodeIds {
        node: Some(7),
        token: None,
    };

    let f = template("orders", "{yyyy}{MM}{dd}{node:2}{seq:6}");
    let bound = f.bind([]).expect("params");
    let mut counter = 0u64;
    g.bench_function("template_render", |b| {
        b.iter(|| {
            counter = (counter + 1) % 1_000_000;
            let id = f
                .render(black_box(NOW_MS), counter, node, &bound)
                .expect("render");
            black_box(id)
        })
    });

    let fields = CivilFields::at(NOW_MS, &Zone::get("Asia/Shanghai").expect("zone")).expect("time");
    let t = f.template().expect("template");
    g.bench_function("template_render_batch_fields", |b| {
        b.iter(|| {
            counter = (counter + 1) % 1_000_000;
            let id = f
                .render_fields(t, black_box(&fields), counter, node, &bound)
                .expect("render");
            black_box(id)
        })
    });

    let f2 = template(
        "policies",
        "PICC-{yyyy}{MM}{dd}-{param:biz:4:alnum}-{node:2}{seq:8}{check:mod97}",
    );
    let bound2 = f2.bind([("biz", "CAR1")]).expect("params");
    g.bench_function("template_render_check_params", |b| {
        b.iter(|| {
            counter = (counter + 1) % 100_000_000;
            let id = f2
                .render(black_box(NOW_MS), counter, node, &bound2)
                .expect("render");
            black_box(id)
        })
    });

    let def = FormatDef {
        lua: Some(DAILY_LUA_RULE.to_owned()),
        template: None,
        reset: None,
        ..FormatDef::template("o2o", "", "Asia/Shanghai", Reset::Never)
    };
    let lua = Format::compile(def, NOW_MS, LuaLimits::default()).expect("lua format");
    let lua_bound = lua.bind([]).expect("params");
    g.bench_function("lua_create_id", |b| {
        b.iter(|| {
            counter = (counter + 1) % 10_000;
            let id = lua
                .render(black_box(NOW_MS), counter, NodeIds::default(), &lua_bound)
                .expect("create_id");
            black_box(id)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
