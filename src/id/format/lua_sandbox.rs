//! The run time of a Lua rule ([`super::lua`]): the sandboxed state, the
//! meter that stops a call (instruction budget and wall-clock deadline),
//! and the gate that serialises a rule's calls.
//!
//! # Why a rule is pure
//!
//! The rule's chunk is compiled once as a function of its environment
//! (`local _ENV = ...` ahead of the source, on the same line) and run
//! again for every call in a new environment table, so neither globals
//! nor upvalues (`local n = 0` captured by `create_id`) outlive a call.
//! The environment falls back, read-only, on an allowlist of the base
//! functions and on read-only proxies of `string`, `math`, `table` and
//! `utf8` (writing to them raises an error). `pairs` and `next` raise an
//! error: their order over string keys follows a hash seed Lua draws anew
//! in every process, so a rule iterating a table with them could render
//! another ID for the same counter after a restart, or on another node.
//! The shared metatables (strings', numbers') are protected
//! (`__metatable`), the real library tables are reachable from neither,
//! and `rawset` and the state's globals are gone. What a call can change
//! is its own tables; the next call, of this rule or another, starts
//! from the same state.
//!
//! # Why a rule is bounded
//!
//! The count hook (every [`STRIDE`] instructions) stops a call past its
//! instruction budget or its wall-clock deadline, but it never fires
//! inside a C function. Every library function whose C loop length a
//! rule controls is therefore guarded before it runs: `string.rep` takes
//! numeric strings as numbers and is capped at [`MAX_REP`] repetitions
//! and [`MAX_REP_BYTES`] bytes of output (an empty string repeated 10^15
//! times allocates nothing and loops for days); `table.insert`,
//! `table.remove`, `table.concat`, `table.unpack` and `table.sort` refuse
//! tables with a metatable (a `__len` of `math.maxinteger`, or an
//! `__index` that is a C function) and lengths or ranges over
//! [`MAX_TABLE_ITEMS`] (a plain table's border can be 2^59 with 60
//! entries); `table.move`, the pattern functions and `string.dump` are
//! removed. The rest of `string`, `utf8`, `math` and the base functions
//! loop at most over a string or table already in memory, which the
//! memory limit bounds. `tostring` and `string.format("%s")` show a table
//! or function as its type name, and `%p` is refused: an address is not
//! a pure function of the call's arguments. What the guards cannot rule
//! out is left to the caller's thread pool (`modes::lua_pool`), which
//! sets a thread stuck past its deadline aside.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use mlua::{chunk::ChunkMode, Function, HookTriggers, Lua, LuaOptions, StdLib, Table, VmState};

/// The default of [`LuaLimits::check_budget`] (`formatted.lua_check_budget`).
pub const DEFAULT_CHECK_BUDGET: Duration = Duration::from_secs(10);

/// Per-rule limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LuaLimits {
    /// Lua VM instructions one call may run (loading the rule included).
    pub instructions: u64,
    /// Bytes the rule's state may allocate.
    pub memory_bytes: usize,
    /// Wall-clock time loading the rule may take, its checks included
    /// (`formatted.lua_check_budget`). The instruction budgets do not
    /// bound it: a call can spend tens of milliseconds in a few library
    /// calls (a sort of 100,000 items), and the checks make up to about
    /// 110,000 calls.
    pub check_budget: Duration,
}

impl Default for LuaLimits {
    /// 200,000 instructions (a daily counter rule needs about 20), 8 MiB
    /// and [`DEFAULT_CHECK_BUDGET`].
    fn default() -> Self {
        LuaLimits {
            instructions: 200_000,
            memory_bytes: 8 << 20,
            check_budget: DEFAULT_CHECK_BUDGET,
        }
    }
}

/// Most repetitions one `string.rep` may make.
pub const MAX_REP: u64 = 1_000_000;
/// Most bytes one `string.rep` may return.
pub const MAX_REP_BYTES: u64 = 1 << 20;
/// Longest table (or widest range) the guarded `table` functions take.
pub const MAX_TABLE_ITEMS: u64 = 100_000;
/// Instructions between two runs of the count hook.
pub const STRIDE: u32 = 100;

/// Lua code run once per state: the guards, the read-only base
/// environment, `now`'s maker and the per-call runner. Part of a rule's
/// check key ([`super::lua::check_key`]): the checks a rule passed hold
/// for the sandbox they ran in.
pub(super) const PRELUDE: &str = r##"
local rep, setmt, getmt, rawget, rawlen, type, error, tonumber, tostring, select, ipairs =
    string.rep, setmetatable, getmetatable, rawget, rawlen, type, error, tonumber, tostring, select, ipairs
local strlen, format, find, byte = string.len, string.format, string.find, string.byte
local MAX_REP, MAX_REP_BYTES, MAX_ITEMS = ...

local function textlen(v)
    local t = type(v)
    if t == "string" or t == "number" then return strlen(v) end
    return nil
end

string.rep = function(s, n, sep)
    local k = tonumber(n)
    local ls, lsep = textlen(s), sep == nil and 0 or textlen(sep)
    if k == nil or ls == nil or lsep == nil then return rep(s, n, sep) end
    if k ~= k or k > MAX_REP then
        error("string.rep: at most " .. MAX_REP .. " repetitions", 2)
    end
    if k >= 1 and ls * k + lsep * (k - 1) > MAX_REP_BYTES then
        error("string.rep: at most " .. MAX_REP_BYTES .. " bytes of output", 2)
    end
    return rep(s, k, sep)
end

-- Table functions honour __len and __index in C, out of the hook's reach:
-- only plain tables, and bounded lengths and ranges.
local function plain(t, fname)
    if type(t) ~= "table" then
        error("table." .. fname .. ": a table expected, got " .. type(t), 3)
    end
    if getmt(t) ~= nil then
        error("table." .. fname .. ": tables with a metatable are not allowed in rules", 3)
    end
    local n = rawlen(t)
    if n > MAX_ITEMS then
        error("table." .. fname .. ": at most " .. MAX_ITEMS .. " items", 3)
    end
    return n
end
local function span(fname, i, j)
    local a, b = tonumber(i), tonumber(j)
    if a and b and b - a >= MAX_ITEMS then
        error("table." .. fname .. ": at most " .. MAX_ITEMS .. " items", 3)
    end
end
local tinsert, tremove, tconcat, tunpack, tsort =
    table.insert, table.remove, table.concat, table.unpack, table.sort
table.insert = function(t, ...) plain(t, "insert") return tinsert(t, ...) end
table.remove = function(t, ...) plain(t, "remove") return tremove(t, ...) end
table.sort = function(t, ...) plain(t, "sort") return tsort(t, ...) end
table.concat = function(t, sep, i, j)
    local n = plain(t, "concat")
    span("concat", i == nil and 1 or i, j == nil and n or j)
    return tconcat(t, sep, i, j)
end
table.unpack = function(t, i, j)
    local n = plain(t, "unpack")
    span("unpack", i == nil and 1 or i, j == nil and n or j)
    return tunpack(t, i, j)
end

-- No addresses: they differ from call to call.
local function has_tostring(v)
    local mt = getmt(v)
    return type(mt) == "table" and rawget(mt, "__tostring") ~= nil
end
local function pure_tostring(v)
    local t = type(v)
    if (t == "table" or t == "function" or t == "userdata" or t == "thread") and not has_tostring(v) then
        return t
    end
    return tostring(v)
end
string.format = function(fmt, ...)
    if type(fmt) == "string" then
        local i = find(fmt, "%", 1, true)
        while i do
            local j = i + 1
            while j <= #fmt and find("-+ #0123456789.", fmt:sub(j, j), 1, true) do j = j + 1 end
            if byte(fmt, j) == 112 then -- "p"
                error("string.format: %p (an address) is not allowed in rules", 2)
            end
            i = find(fmt, "%", j + 1, true)
        end
    end
    local n = select("#", ...)
    if n == 0 then return format(fmt) end
    local args = {...}
    for k = 1, n do
        local t = type(args[k])
        if t == "table" or t == "function" or t == "userdata" or t == "thread" then
            args[k] = pure_tostring(args[k])
        end
    end
    return format(fmt, tunpack(args, 1, n))
end
string.find, string.match, string.gmatch, string.gsub, string.dump = nil, nil, nil, nil, nil
table.move = nil
math.random, math.randomseed = nil, nil

local function frozen(lib, name)
    return setmt({}, {
        __index = lib,
        __newindex = function() error(name .. " is read-only in rules", 2) end,
        __metatable = false,
    })
end
-- The order of `next`/`pairs` over string keys follows the state's hash
-- seed, which Lua draws anew in every process: a rule that used it would
-- render another ID for the same counter after a restart or on another node.
local function unordered()
    error("pairs and next are not available in rules: their order over string keys differs "
        .. "between processes, so the same counter could render another ID after a restart; "
        .. "iterate an array with ipairs instead", 2)
end
local base = {
    assert = assert, error = error, getmetatable = getmetatable, ipairs = ipairs,
    next = unordered, pairs = unordered, rawequal = rawequal, rawget = rawget,
    rawlen = rawlen, select = select, tonumber = tonumber, type = type,
    tostring = pure_tostring, _VERSION = _VERSION,
    setmetatable = function(t, mt)
        if type(mt) == "table" and rawget(mt, "__gc") ~= nil then
            error("__gc metamethods are not allowed in rules", 2)
        end
        return setmt(t, mt)
    end,
    string = frozen(string, "string"), math = frozen(math, "math"),
    table = frozen(table, "table"), utf8 = frozen(utf8, "utf8"),
}
getmt("").__metatable = false

-- `now` for one second: a read-only proxy whose methods are closures
-- over the fields (plain Lua calls, no trip into Rust per method).
local function make_now(y, mo, d, h, mi, s, yd, wd, u)
    local m = {
        year = function() return y end, month = function() return mo end,
        day = function() return d end, hour = function() return h end,
        min = function() return mi end, sec = function() return s end,
        yday = function() return yd end, wday = function() return wd end,
        unix = function() return u end,
    }
    return setmt({}, {
        __index = m,
        __newindex = function() error("now is read-only", 2) end,
        __metatable = false,
    })
end

local ENV_MT = { __index = base, __metatable = false }
local function fresh_env()
    local env = setmt({}, ENV_MT)
    env._G = env
    return env
end
-- One call: the rule's chunk in a new environment, then its `name`.
local function run(chunk, name, ...)
    local env = fresh_env()
    chunk(env)
    local f = rawget(env, name)
    if type(f) ~= "function" then return false, name end
    return true, f(...)
end
-- The first of the four functions the chunk does not define, or nil.
local function missing(chunk)
    local env = fresh_env()
    chunk(env)
    for _, name in ipairs({ "min_counter", "max_counter", "reset_seconds", "create_id" }) do
        if type(rawget(env, name)) ~= "function" then return name end
    end
    return nil
end
return make_now, run, missing, base
"##;

/// Set by [`allow_test_stall`]: new states get `__test_stall`.
static TEST_STALL: AtomicBool = AtomicBool::new(false);

/// Tests only: rules loaded after this can call `__test_stall(ms)`, which
/// sleeps in Rust where the count hook cannot stop it, standing in for a
/// C loop the guards failed to bound (there is no known one left). Lets an
/// end-to-end test show that a stuck call costs one thread, not the node.
#[doc(hidden)]
pub fn allow_test_stall() {
    TEST_STALL.store(true, Ordering::Relaxed);
}

/// A rule's Lua state and the prelude's functions.
pub(super) struct Sandbox {
    pub(super) lua: Lua,
    /// `make_now(fields...)`: the read-only `now`.
    pub(super) make_now: Function,
    /// `run(chunk, name, args...)`: `(true, results...)` or `(false, name)`.
    pub(super) run: Function,
    /// `missing(chunk)`: the first required function not defined, or nil.
    pub(super) missing: Function,
}

impl Sandbox {
    /// A fresh state with only the safe libraries, guarded and read-only,
    /// `generate_counter` on numbers and the memory limit set.
    pub(super) fn new(limits: LuaLimits) -> mlua::Result<Sandbox> {
        let lua = Lua::new_with(
            StdLib::STRING | StdLib::MATH | StdLib::TABLE | StdLib::UTF8,
            LuaOptions::new(),
        )?;
        let (make_now, run, missing, base): (Function, Function, Function, Table) = lua
            .load(PRELUDE)
            .set_name("=sandbox")
            .call((MAX_REP, MAX_REP_BYTES, MAX_TABLE_ITEMS))?;
        if TEST_STALL.load(Ordering::Relaxed) {
            let stall = lua.create_function(|_, ms: u64| {
                std::thread::sleep(Duration::from_millis(ms));
                Ok(())
            })?;
            base.raw_set("__test_stall", stall)?;
        }
        // `counter:generate_counter()` on a plain integer; the
        // metatable is shared by every number, so protected.
        let number_mt = lua.create_table()?;
        let methods = lua.create_table()?;
        methods.raw_set(
            "generate_counter",
            lua.create_function(|_, n: mlua::Value| Ok(n))?,
        )?;
        number_mt.raw_set("__index", methods)?;
        number_mt.raw_set("__metatable", false)?;
        lua.set_type_metatable::<mlua::Number>(Some(number_mt));
        // Nothing may reach the state's own globals.
        let g = lua.globals();
        for pair in g.clone().pairs::<mlua::Value, mlua::Value>() {
            let (k, _) = pair?;
            g.raw_set(k, mlua::Value::Nil)?;
        }
        lua.set_memory_limit(limits.memory_bytes)?;
        Ok(Sandbox {
            lua,
            make_now,
            run,
            missing,
        })
    }

    /// Compiles `source` (text only) as rule `name`: a function of the
    /// environment each call passes.
    pub(super) fn compile(&self, name: &str, source: &str) -> mlua::Result<Function> {
        // On the source's first line, so line numbers stay the rule's.
        self.lua
            .load(format!("local _ENV = ...; {source}"))
            .set_name(format!("={name}"))
            .set_mode(ChunkMode::Text)
            .set_environment(self.lua.create_table()?)
            .into_function()
    }
}

/// Why the meter stopped a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Trip {
    /// The instruction budget is spent.
    Budget,
    /// The wall-clock deadline passed.
    Deadline,
}

const NOT_TRIPPED: u8 = 0;
const TRIP_BUDGET: u8 = 1;
const TRIP_DEADLINE: u8 = 2;

/// What the count hook counts for the call running now: instructions
/// spent, the deadline, when the call started, and why and where it was
/// stopped.
pub(super) struct Meter {
    epoch: Instant,
    spent: AtomicU64,
    tripped: AtomicU8,
    trip_line: AtomicU64,
    /// Nanoseconds after `epoch`; 0: none.
    deadline_ns: AtomicU64,
    /// Nanoseconds after `epoch` the running call started; 0: idle.
    started_ns: AtomicU64,
}

impl Meter {
    /// Installs the count hook on `lua`, failing a call once
    /// `limits.instructions` are spent or its deadline has passed.
    pub(super) fn install(lua: &Lua, limits: LuaLimits) -> mlua::Result<Arc<Meter>> {
        let meter = Arc::new(Meter {
            epoch: Instant::now(),
            spent: AtomicU64::new(0),
            tripped: AtomicU8::new(NOT_TRIPPED),
            trip_line: AtomicU64::new(0),
            deadline_ns: AtomicU64::new(0),
            started_ns: AtomicU64::new(0),
        });
        let stride = STRIDE.min(u32::try_from(limits.instructions.max(1)).unwrap_or(STRIDE));
        let budget = limits.instructions;
        let m = Arc::clone(&meter);
        lua.set_hook(
            HookTriggers::new().every_nth_instruction(stride),
            move |_, debug| {
                let used =
                    m.spent.fetch_add(u64::from(stride), Ordering::Relaxed) + u64::from(stride);
                let deadline = m.deadline_ns.load(Ordering::Relaxed);
                let trip = if used > budget {
                    TRIP_BUDGET
                } else if deadline != 0 && m.now_ns() > deadline {
                    TRIP_DEADLINE
                } else {
                    return Ok(VmState::Continue);
                };
                if m.tripped
                    .compare_exchange(NOT_TRIPPED, trip, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
                {
                    // A line of the rule's, not of the sandbox's prelude.
                    let ours = debug.source().source.as_deref() == Some("=sandbox");
                    let line = if ours {
                        0
                    } else {
                        debug.current_line().unwrap_or(0) as u64
                    };
                    m.trip_line.store(line, Ordering::Relaxed);
                }
                Err(mlua::Error::runtime("stopped by the sandbox"))
            },
        )?;
        Ok(meter)
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// A new call: a fresh budget, and `deadline` if given.
    pub(super) fn start(&self, deadline: Option<Instant>) {
        self.spent.store(0, Ordering::Relaxed);
        self.tripped.store(NOT_TRIPPED, Ordering::Relaxed);
        let deadline_ns = deadline.map_or(0, |d| {
            let ns = d.saturating_duration_since(self.epoch).as_nanos();
            u64::try_from(ns).unwrap_or(u64::MAX).max(1)
        });
        self.deadline_ns.store(deadline_ns, Ordering::Relaxed);
        self.started_ns.store(self.now_ns(), Ordering::Relaxed);
    }

    /// Instructions the last call ran (to the hook's stride).
    pub(super) fn spent(&self) -> u64 {
        self.spent.load(Ordering::Relaxed)
    }

    /// The call returned.
    pub(super) fn finish(&self) {
        self.started_ns.store(0, Ordering::Relaxed);
    }

    /// Why and on which line the last call was stopped, if it was.
    pub(super) fn trip(&self) -> Option<(Trip, Option<u32>)> {
        let trip = match self.tripped.load(Ordering::Relaxed) {
            TRIP_BUDGET => Trip::Budget,
            TRIP_DEADLINE => Trip::Deadline,
            _ => return None,
        };
        let line = self.trip_line.load(Ordering::Relaxed);
        Some((trip, u32::try_from(line).ok().filter(|l| *l > 0)))
    }

    /// How long the call running now has run; `None` when idle.
    pub(super) fn running_for(&self) -> Option<Duration> {
        match self.started_ns.load(Ordering::Relaxed) {
            0 => None,
            started => Some(Duration::from_nanos(self.now_ns().saturating_sub(started))),
        }
    }
}

/// Serialises a rule's calls, with a timed wait (a call stuck in C holds
/// the gate; a caller with a deadline gives up instead of waiting for
/// it), and keeps `now` for the last Unix second rendered (IDs come in
/// bursts at one instant; `now` is immutable).
pub(super) struct CallGate {
    slot: Mutex<Slot>,
    freed: Condvar,
}

struct Slot {
    busy: bool,
    now: Option<(i64, Table)>,
}

/// A call holding the gate; gives it back when dropped (panics included).
pub(super) struct GateGuard<'a> {
    gate: &'a CallGate,
    /// The cached `now`, put back when the call ends.
    pub(super) now: Option<(i64, Table)>,
}

impl CallGate {
    pub(super) fn new() -> Self {
        CallGate {
            slot: Mutex::new(Slot {
                busy: false,
                now: None,
            }),
            freed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for the gate, until `deadline` if given; `None` if it did not
    /// come free in time.
    pub(super) fn enter(&self, deadline: Option<Instant>) -> Option<GateGuard<'_>> {
        let mut slot = self.lock();
        while slot.busy {
            slot = match deadline {
                None => self
                    .freed
                    .wait(slot)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(d) => {
                    let left = d.checked_duration_since(Instant::now())?;
                    self.freed
                        .wait_timeout(slot, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
        slot.busy = true;
        let now = slot.now.take();
        Some(GateGuard { gate: self, now })
    }
}

impl Drop for GateGuard<'_> {
    fn drop(&mut self) {
        let mut slot = self.gate.lock();
        slot.busy = false;
        slot.now = self.now.take();
        drop(slot);
        self.gate.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::super::lua::{Deadline, LuaError, LuaLimits, LuaRule};
    use super::super::period::Zone;
    use std::collections::HashSet;
    use std::time::Duration;

    fn load(name: &str, src: &str) -> Result<LuaRule, LuaError> {
        LuaRule::load(name, src, Zone::utc(), None, 1, LuaLimits::default(), 0)
    }

    /// A rule around `body` (the body of create_id) with `top` before it.
    fn rule(top: &str, body: &str) -> String {
        format!(
            "{top}\nfunction min_counter() return 0 end\nfunction max_counter() return 9999 end\nfunction reset_seconds() return 0 end\nfunction create_id(counter, now, salt)\n{body}\nend\n"
        )
    }

    /// 50 calls with counters 0..50: 50 distinct IDs, each what a fresh
    /// state gives, and the same ID again for the same input.
    fn renders_from_a_fresh_state(rule: &LuaRule) {
        let ids: Vec<String> = (0..50u64)
            .map(|c| rule.create_id(c, 0, None).unwrap())
            .collect();
        let distinct: HashSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), 50, "{ids:?}");
        for (c, id) in ids.iter().enumerate() {
            assert_eq!(id, &format!("{c:04}"));
            assert_eq!(&rule.create_id(c as u64, 0, None).unwrap(), id);
        }
    }

    /// The reported rule: a global call count passes the load-time checks
    /// (a handful of calls) and then folds the counter onto 7 IDs. Every
    /// call runs in a fresh environment, so the count is 1 every time.
    #[test]
    fn a_global_counting_rule_renders_every_call_from_a_fresh_state() {
        let src = rule(
            "",
            "calls = (calls or 0) + 1\nif calls > 6 then return 'X' .. (counter % 7) end\nreturn string.format('%04d', counter)",
        );
        renders_from_a_fresh_state(&load("global", &src).unwrap());
        // _G is the call's own environment too.
        let src = rule(
            "",
            "_G.calls = (_G.calls or 0) + 1\nif _G.calls > 6 then return 'X' .. (counter % 7) end\nreturn string.format('%04d', counter)",
        );
        renders_from_a_fresh_state(&load("g", &src).unwrap());
    }

    /// The same with an upvalue: `local n` captured by create_id is
    /// created again for every call.
    #[test]
    fn an_upvalue_counting_rule_renders_every_call_from_a_fresh_state() {
        let src = rule(
            "local n = 0",
            "n = n + 1\nif n > 6 then return 'X' .. (counter % 7) end\nreturn string.format('%04d', counter)",
        );
        renders_from_a_fresh_state(&load("upvalue", &src).unwrap());
    }

    /// A rule (steered by a caller's salt) trying to change what later
    /// calls see: writes to shared metatables and library tables are
    /// refused, shadowing a library is the call's own business; later
    /// calls of this rule and another rule render as before.
    #[test]
    fn metatable_and_library_rewrites_are_refused_or_without_effect() {
        let tamper = [
            "getmetatable('').__index.format = function() return 'HIJACK' end",
            "getmetatable('').__index = {format = function() return 'HIJACK' end}",
            "setmetatable(getmetatable(''), {})",
            "getmetatable(0).__index.generate_counter = function() return 1 end",
            "getmetatable(0).__index = {}",
            "string.format = function() return 'HIJACK' end",
            "table.concat = function() return 'HIJACK' end",
            "math.floor = nil",
            "setmetatable(string, {__index = function() return function() return 'HIJACK' end end})",
            "rawset(string, 'format', function() return 'HIJACK' end)",
            "string = {format = function() return 'HIJACK' end}",
            "_G.string = {format = function() return 'HIJACK' end}",
            "setmetatable(_ENV, {__index = function() return function() return 'HIJACK' end end})",
            "tostring = function() return 'HIJACK' end",
            "getmetatable = function() return {} end",
        ];
        let body = format!(
            "local tamper = {{\n{}\n}}\nif salt and salt:sub(1, 6) == 'tamper' then tamper[tonumber(salt:sub(7))]() end\nreturn string.format('%04d', counter:generate_counter()) .. tostring(counter % 1)",
            tamper
                .iter()
                .map(|t| format!("function() {t} end,"))
                .collect::<String>()
        );
        let evil = load("evil", &rule("", &body)).unwrap();
        let other = load(
            "other",
            &rule(
                "",
                "return string.format('%04d', counter:generate_counter())",
            ),
        )
        .unwrap();
        for (i, what) in tamper.iter().enumerate() {
            // Salts the load-time checks never use, so the rule loads.
            let salt = format!("tamper{}", i + 1);
            match evil.create_id(7, 0, Some(&salt)) {
                Err(LuaError::Runtime { .. }) => {}
                // Shadowing a library is the call's own business.
                Ok(_) => {}
                Err(e) => panic!("{what}: {e}"),
            }
            for c in [1u64, 42] {
                assert_eq!(
                    evil.create_id(c, 0, None).unwrap(),
                    format!("{c:04}0"),
                    "after {what}"
                );
                assert_eq!(
                    other.create_id(c, 0, None).unwrap(),
                    format!("{c:04}"),
                    "after {what}"
                );
            }
        }
    }

    /// Library calls whose C loop a rule controls fail at once with a
    /// message naming the limit, instead of looping where the count hook
    /// never fires. (Run on a thread with a generous bound, so the old
    /// sandbox fails this test instead of hanging it.)
    #[test]
    fn library_calls_that_would_loop_in_c_fail_fast() {
        let maxlen = "setmetatable({}, {__len = function() return math.maxinteger end})";
        let c_index = "setmetatable({}, {__index = tostring})";
        // A plain table whose border (#t) is 2^59: 60 entries.
        let border = "(function() local t = {} for i = 1, 10 do t[i] = 'x' end t[17] = 'x' for i = 4, 59 do t[1 << i] = 'x' end assert(rawlen(t) > 1e15, rawlen(t)) return t end)()";
        let cases = [
            ("string.rep('', '1e15')", "string.rep: at most"),
            ("string.rep('x', '1e15')", "string.rep: at most"),
            ("(''):rep(1e15)", "string.rep: at most"),
            ("string.rep('', 1e6, string.rep('', 1e6))", ""),
            ("string.rep('abc', 999999)", "bytes of output"),
            (&format!("table.remove({maxlen}, 1)"), "metatable"),
            (&format!("table.insert({maxlen}, 1, 'x')"), "metatable"),
            (&format!("table.concat({maxlen})"), "metatable"),
            (&format!("table.unpack({maxlen})"), "metatable"),
            (&format!("table.sort({maxlen})"), "metatable"),
            (
                &format!("table.concat({c_index}, '', 1, 1e15)"),
                "metatable",
            ),
            (&format!("table.unpack({c_index}, 1, 1e7)"), "metatable"),
            (
                &format!("table.remove({border}, 1)"),
                "at most 100000 items",
            ),
            (
                &format!("table.insert({border}, 1, 'x')"),
                "at most 100000 items",
            ),
            (&format!("table.sort({border})"), "at most 100000 items"),
            ("table.concat({'a'}, '', 1, 1e15)", "at most 100000 items"),
            ("table.unpack({}, 1, 1e15)", "at most 100000 items"),
            ("table.unpack('abc', 1, 1e15)", "a table expected"),
            ("string.format('%p', {})", "%p"),
        ];
        for (expr, says) in cases {
            // Run on a salt the load-time checks never use: the rule loads,
            // and the call is what must fail fast.
            let src = rule(
                "",
                &format!("if salt == 'go' then {expr} end\nreturn string.format('%04d', counter)"),
            );
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let got = load("hostile", &src).and_then(|r| r.create_id(1, 0, Some("go")));
                let _ = tx.send(got.map(|_| ()));
            });
            let got = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("{expr} still running after 30 s"));
            if says.is_empty() {
                // Within bounds: allowed.
                assert!(got.is_ok(), "{expr}: {got:?}");
                continue;
            }
            match got {
                Err(LuaError::Runtime {
                    line: Some(6),
                    ref message,
                    ..
                }) if message.contains(says) => {}
                other => panic!("{expr}: {other:?}"),
            }
        }
    }

    /// Addresses are not part of a call's output: tables and functions
    /// print as their type.
    #[test]
    fn tables_and_functions_print_without_addresses() {
        let src = rule(
            "",
            "return tostring({}) .. tostring(print) .. string.format('%s%s', {}, now) .. string.format('%04d', counter)",
        );
        let r = load("addr", &src).unwrap();
        assert_eq!(r.create_id(3, 0, None).unwrap(), "tableniltabletable0003");
    }

    /// `pairs` and `next` are refused with the reason: their order over
    /// string keys changes with each process's hash seed, so a rule
    /// rendering through them would not be one function across restarts.
    #[test]
    fn pairs_and_next_are_refused_since_their_order_changes_between_processes() {
        for body in [
            "local t = {a = 1, b = 2} local s = '' for k in pairs(t) do s = s .. k end return s .. string.format('%04d', counter)",
            "local t = {a = 1} return tostring(next(t)) .. string.format('%04d', counter)",
        ] {
            let err = match load("unordered", &rule("", body)) {
                Ok(_) => panic!("a rule iterating with pairs/next loaded: {body}"),
                Err(e) => e.to_string(),
            };
            assert!(
                err.contains("pairs and next are not available in rules"),
                "{body}: {err}"
            );
        }
    }

    /// A call past its wall-clock deadline in Lua code is stopped there
    /// (the instruction budget set out of the way).
    #[test]
    fn lua_code_past_its_deadline_is_stopped() {
        let limits = LuaLimits {
            instructions: u64::MAX / 2,
            ..LuaLimits::default()
        };
        let src = rule(
            "",
            "if salt == 'spin' then while true do end end return tostring(counter)",
        );
        let r = std::sync::Arc::new(
            LuaRule::load("slow", &src, Zone::utc(), None, 1, limits, 0).unwrap(),
        );
        // On a thread with a generous bound, so a missing deadline fails
        // this test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        let rule = std::sync::Arc::clone(&r);
        std::thread::spawn(move || {
            let deadline = Deadline::after(Duration::from_millis(20));
            let _ = tx.send(rule.create_id_until(1, 0, Some("spin"), Some(deadline)));
        });
        let err = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("stopped at its deadline, not after 30 s")
            .unwrap_err();
        assert!(
            matches!(err, LuaError::Deadline { ref rule, line: Some(6), deadline_ms: 20 } if rule == "slow"),
            "{err:?}"
        );
        assert!(err.to_string().contains("20 ms deadline"), "{err}");
        assert_eq!(r.running_for(), None);
        // The rule is usable again at once.
        assert_eq!(r.create_id(2, 0, None).unwrap(), "2");
    }
}
