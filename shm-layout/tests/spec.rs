//! The specification in the crate docs (`src/lib.rs`) checked against the
//! code, so that the two cannot drift apart:
//!
//! * every structure table (a heading `… [`layout::Type`], N bytes` and a
//!   table `| offset | size | field | meaning |`): N is `size_of::<Type>()`,
//!   the rows list every field once, in order, from offset 0 to the end
//!   without gaps, each with its `offset_of!`, its size and, for `name[N]`,
//!   its number of elements; every bound `≤ N` in a meaning is the code's;
//!   the header's fixed values (magic, versions, byte-order mark, size) are
//!   the constants;
//! * the section kind table (`| kind | section | count | stride | content |`)
//!   against the directory of a segment created for the test;
//! * the lost counter table against [`LostKind`];
//! * every `Type (N B)` annotation (the diagrams) against `size_of`;
//! * the section offsets in the file diagram against that directory;
//! * the layout version (`**M.N**`, and any number after "major" or
//!   "minor" in the docs of `lib.rs` and `layout.rs`) against
//!   [`LAYOUT_MAJOR`] and [`LAYOUT_MINOR`].
//!
//! A failure names the line of `src/lib.rs` that disagrees.

use std::collections::{BTreeMap, BTreeSet};
use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use pfs_shm_layout::layout::*;
use pfs_shm_layout::segment::{MAX_HISTORY_LONG_LEN, MAX_PAGES};
use pfs_shm_layout::seqlock::SeqLock;
use pfs_shm_layout::{Geometry, Segment, SegmentConfig, TimerCalibration};

const LIB_RS: &str = include_str!("../src/lib.rs");
const LAYOUT_RS: &str = include_str!("../src/layout.rs");

// ---------------------------------------------------------------------------
// The code side: every structure of the format, field by field.
// ---------------------------------------------------------------------------

/// Number of elements of a field: N for an array, 1 otherwise.
trait Elements {
    const N: usize;
}

impl<T, const N: usize> Elements for [T; N] {
    const N: usize = N;
}

macro_rules! one_element {
    ($($t:ty),*) => { $(impl Elements for $t { const N: usize = 1; })* };
}
one_element!(AtomicU32, AtomicU64, SeqLock, EventRecord, StatementRecord);

fn field_size<S, F>(_: fn(&S) -> &F) -> usize {
    size_of::<F>()
}

fn field_len<S, F: Elements>(_: fn(&S) -> &F) -> usize {
    F::N
}

struct Field {
    name: &'static str,
    offset: usize,
    size: usize,
    len: usize,
}

struct Struct {
    size: usize,
    fields: Vec<Field>,
}

/// `Type { field, ... }`: the type's size and each field's offset, size
/// and number of elements, as the compiler lays them out.
macro_rules! structs {
    ($($t:ident { $($f:ident),* $(,)? })*) => {{
        let mut m = BTreeMap::new();
        $(m.insert(stringify!($t), Struct {
            size: size_of::<$t>(),
            fields: vec![$(Field {
                name: stringify!($f),
                offset: offset_of!($t, $f),
                size: field_size(|s: &$t| &s.$f),
                len: field_len(|s: &$t| &s.$f),
            }),*],
        });)*
        m
    }};
}

fn code_structs() -> BTreeMap<&'static str, Struct> {
    structs! {
        Header {
            magic, major, minor, byte_order, header_size, segment_size, state,
            creator_pid, section_count, start_time_unix_ns, timer_base_ticks,
            timer_ps_per_tick_q32, timer_frequency_hz, timer_kind, history_len,
            service_name_len, reserved0, service_name, timer_base_ns,
            history_long_len, long_reserved, reserved1, sections, padding,
        }
        SectionEntry { kind, reserved, offset, size, count, stride }
        LostCounters { counters }
        ClassEntry { state, flags, kind, name_len, name }
        StringEntry { state, len, bytes }
        GlobalHeader { seq, fold_count, reserved, fold_log }
        FoldLogEntry { ticket, record, version }
        SummaryRow {
            pending, count, timed_count, sum_lo, sum_hi, min, max, bytes, buckets,
            errors, warnings, rows_affected, rows_sent, rows_examined, cpu_time,
            cancelled, reserved,
        }
        IoTail { count, sum_ns, bytes }
        MemoryRow {
            reserved0, count_alloc, count_free, sum_bytes_alloc, sum_bytes_free,
            low_count_used, high_count_used, low_bytes_used, high_bytes_used,
            truncate_gen, reserved,
        }
        MemoryRowV5 {
            reserved0, count_alloc, count_free, sum_bytes_alloc, sum_bytes_free,
            low_count_used, current_count_used, high_count_used, low_bytes_used,
            current_bytes_used, high_bytes_used, truncate_gen, reserved,
        }
        EventRecord {
            seq, event_id, end_event_id, class, operation, timer_start, timer_end,
            timer_wait, object_instance, bytes, spins, source, object_name,
            nesting_event_id, nesting_event_type, flags, event_type, reserved32,
            thread_id, cpu_time,
        }
        StatementRecord {
            ev, errors, warnings, rows_affected, rows_sent, rows_examined, digest,
            text_len, reserved, text,
        }
        ThreadHeader {
            lock, seq, thread_id, os_tid, name_len, flags, name, user, host, role,
            reserved0, history_next, reserved1, history_count, touched,
            waits_current, stages_current, statements_current,
        }
        SetupSection {
            consumers, reserved0, timers, reserved1, actors_version,
            memory_truncate_gen, agent_defaults, reserved2, actors, padding,
        }
        ActorEntry {
            seq, flags, host_len, user_len, role_len, host, user, role, reserved,
        }
        LongHeader { next, reserved0, len, slot_size, reserved1 }
        ContainerHeader {
            records_per_page, max_pages, record_size, page_size, pages_offset,
            pages_added, pages_reclaimed, pages_revived, reserved,
        }
        TasksHeader { used, reserved0, reserved }
        TaskSlot { waits_current, stages_current, statements_current }
    }
}

/// Whether `n` is exactly the largest value `Geometry::new` accepts for
/// the configuration field that `set` writes.
fn config_limit(n: u64, set: fn(&mut SegmentConfig, u32)) -> bool {
    let geometry = |v: u64| {
        let Ok(v) = u32::try_from(v) else {
            return false;
        };
        let mut cfg = SegmentConfig {
            max_pages: 1,
            ..SegmentConfig::default()
        };
        set(&mut cfg, v);
        Geometry::new(&cfg).is_ok()
    };
    geometry(n) && !geometry(n + 1)
}

/// The code's value of a bound `≤ N` written in the meaning of `field`.
fn bound(ty: &str, field: &str, n: u64) -> Result<(), String> {
    let expect = match (ty, field) {
        ("Header", "section_count") => MAX_SECTIONS as u64,
        ("Header", "service_name_len") => SERVICE_NAME_BYTES as u64,
        ("Header", "history_len") => {
            return config_limit(n, |c, v| c.history_len = v)
                .then_some(())
                .ok_or_else(|| format!("`Geometry::new` does not accept history_len up to {n}"));
        }
        ("Header", "history_long_len") => u64::from(MAX_HISTORY_LONG_LEN),
        ("ClassEntry", "name_len") => CLASS_NAME_BYTES as u64,
        ("StringEntry", "len") => STRING_BYTES as u64,
        ("StatementRecord", "text_len") => STATEMENT_TEXT_BYTES as u64,
        ("ThreadHeader", "name_len") => THREAD_NAME_BYTES as u64,
        ("ActorEntry", "host_len" | "user_len" | "role_len") => ACTOR_FIELD_BYTES as u64,
        _ => {
            return Err(format!(
                "no known bound for {ty}.{field}: add it to this test"
            ));
        }
    };
    if n != expect {
        return Err(format!("bound {n}, the code's is {expect}"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The doc side: the Markdown of the crate docs.
// ---------------------------------------------------------------------------

/// The text of the `//!` lines of a source file, with their line numbers.
fn doc_lines(src: &str) -> Vec<(usize, &str)> {
    src.lines()
        .enumerate()
        .filter_map(|(i, l)| {
            let t = l.trim_start();
            let d = t.strip_prefix("//!").or_else(|| t.strip_prefix("///"))?;
            Some((i + 1, d.strip_prefix(' ').unwrap_or(d)))
        })
        .collect()
}

/// The cells of a table row, split on `|` (but not on `\|`).
fn cells(row: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = row.trim().trim_start_matches('|').chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cur.push('|');
                chars.next();
            }
            '|' => out.push(std::mem::take(&mut cur).trim().to_string()),
            _ => cur.push(c),
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// A number as the docs write it: decimal or `0x` hexadecimal.
fn number(s: &str) -> Option<u64> {
    let s = s.trim().trim_matches('`');
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The leading decimal number of `s`, if it starts with one.
fn leading_number(s: &str) -> Option<u64> {
    let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// One Markdown table: its line, header cells and rows (line, cells).
struct Table {
    heading: Option<(usize, String)>,
    header: Vec<String>,
    rows: Vec<(usize, Vec<String>)>,
}

fn tables(lines: &[(usize, &str)]) -> Vec<Table> {
    let mut out = Vec::new();
    let mut heading = None;
    let mut i = 0;
    while i < lines.len() {
        let (n, l) = lines[i];
        if l.starts_with('#') {
            heading = Some((n, l.to_string()));
        }
        if l.starts_with('|') {
            let header = cells(l);
            let mut rows = Vec::new();
            i += 2; // the header and the |---| line
            while i < lines.len() && lines[i].1.starts_with('|') {
                rows.push((lines[i].0, cells(lines[i].1)));
                i += 1;
            }
            out.push(Table {
                heading: heading.clone(),
                header,
                rows,
            });
            continue;
        }
        i += 1;
    }
    out
}

/// `… [`layout::Type`], N bytes` → (Type, N).
fn struct_heading(h: &str) -> Option<Result<(String, u64), String>> {
    let start = h.find("[`layout::")? + "[`layout::".len();
    let ty: String = h[start..].chars().take_while(|c| *c != '`').collect();
    let size = h
        .rsplit_once(", ")
        .and_then(|(_, s)| s.strip_suffix(" bytes"))
        .and_then(number);
    Some(
        size.map(|s| (ty, s)).ok_or_else(|| {
            format!("heading {h:?} must end with \", N bytes\" (the size of the type)")
        }),
    )
}

/// Every `Name (N B)` in a line: (Name, N).
fn size_annotations(l: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut rest = l;
    while let Some(p) = rest.find(" B)") {
        let before = &rest[..p];
        if let Some(open) = before.rfind('(')
            && let Some(n) = number(&before[open + 1..])
        {
            let name = before[..open]
                .trim_end()
                .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .next()
                .unwrap_or("");
            out.push((name.to_string(), n));
        }
        rest = &rest[p + 3..];
    }
    out
}

// ---------------------------------------------------------------------------
// The checks.
// ---------------------------------------------------------------------------

/// A segment whose configuration values are all distinct, so that a
/// symbolic count (`max_classes`) cannot pass for another one.
fn probe() -> (std::fs::File, Segment, SegmentConfig) {
    let cfg = SegmentConfig {
        service_name: "spec".into(),
        history_len: 3,
        max_classes: 5,
        max_strings: 6,
        records_per_page: 2,
        max_pages: 7,
        history_long_len: 11,
        task_slots: 4,
    };
    let f = tempfile::tempfile().unwrap();
    let seg = Segment::create(
        f.try_clone().unwrap(),
        &cfg,
        TimerCalibration::NANOSECONDS,
        1,
        0,
    )
    .unwrap();
    (f, seg, cfg)
}

/// The directory of the probe segment: kind → (offset, count, stride).
fn directory(seg: &Segment) -> BTreeMap<u32, (u64, u64, u64)> {
    let h = seg.header();
    let r = Ordering::Relaxed;
    let n = h.section_count.load(r) as usize;
    h.sections[..n]
        .iter()
        .map(|e| {
            let v = (
                e.offset.load(r),
                u64::from(e.count.load(r)),
                u64::from(e.stride.load(r)),
            );
            (e.kind.load(r), v)
        })
        .collect()
}

fn check_struct_table(
    ty: &str,
    s: &Struct,
    t: &Table,
    errors: &mut Vec<String>,
) -> BTreeSet<&'static str> {
    let mut seen = BTreeSet::new();
    let mut end = 0u64;
    for (line, c) in &t.rows {
        let mut err = |m: String| errors.push(format!("src/lib.rs:{line}: {ty}: {m}"));
        if c.len() != 4 {
            err(format!("a field row has 4 cells, not {}", c.len()));
            continue;
        }
        let name_cell = c[2].trim_matches('`');
        let (name, len) = match name_cell.split_once('[') {
            Some((n, l)) => (n, l.strip_suffix(']').and_then(number)),
            None => (name_cell, None),
        };
        let Some(f) = s.fields.iter().find(|f| f.name == name) else {
            err(format!("`{name}` is not a field of {ty}"));
            continue;
        };
        if !seen.insert(f.name) {
            err(format!("`{name}` is documented twice"));
        }
        let (Some(off), Some(size)) = (number(&c[0]), number(&c[1])) else {
            err(format!(
                "`{name}`: offset {:?} or size {:?} is not a number",
                c[0], c[1]
            ));
            continue;
        };
        if off as usize != f.offset {
            err(format!(
                "`{name}` is at offset {} (0x{:X}), not {off}",
                f.offset, f.offset
            ));
        }
        if size as usize != f.size {
            err(format!("`{name}` is {} bytes, not {size}", f.size));
        }
        if let Some(n) = len
            && n as usize != f.len
        {
            err(format!("`{name}` has {} elements, not {n}", f.len));
        }
        if off != end {
            err(format!(
                "`{name}` at {off} does not follow the previous field, which ends at {end}"
            ));
        }
        end = off + size;
        if let Some(p) = c[3].find('≤')
            && let Some(n) = leading_number(c[3][p + '≤'.len_utf8()..].trim_start())
            && let Err(m) = bound(ty, name, n)
        {
            err(format!("`{name}`: {m}"));
        }
        let meaning = c[3].as_str();
        let fixed = match (ty, name) {
            ("Header", "major") => Some(u64::from(LAYOUT_MAJOR)),
            ("Header", "minor") => Some(u64::from(LAYOUT_MINOR)),
            ("Header", "header_size") => Some(PAGE as u64),
            _ => None,
        };
        if let Some(v) = fixed
            && leading_number(meaning) != Some(v)
        {
            err(format!(
                "`{name}` holds {v}: its meaning must start with it"
            ));
        }
        if (ty, name) == ("Header", "byte_order") {
            let mark = meaning.split('`').nth(1).and_then(number);
            if mark != Some(u64::from(BYTE_ORDER_MARK)) {
                err(format!("the byte-order mark is `0x{BYTE_ORDER_MARK:08x}`"));
            }
        }
        if (ty, name) == ("Header", "magic") {
            let text = meaning.split('"').nth(1).unwrap_or("").replace("\\0", "\0");
            if text.as_bytes() != MAGIC.to_le_bytes() {
                err(format!("the magic is {:?}", MAGIC.to_le_bytes()));
            }
        }
    }
    if end as usize != s.size {
        errors.push(format!(
            "{ty}: the rows end at {end}, the type at {}",
            s.size
        ));
    }
    seen
}

#[test]
fn the_structure_tables_are_the_code() {
    let code = code_structs();
    let lines = doc_lines(LIB_RS);
    let mut errors = Vec::new();
    let mut documented = BTreeMap::new();
    let mut headings = BTreeMap::new();
    for (line, text) in lines.iter().filter(|(_, l)| l.starts_with('#')) {
        match struct_heading(text) {
            None => {}
            Some(Err(m)) => errors.push(format!("src/lib.rs:{line}: {m}")),
            Some(Ok((ty, size))) => match code.get(ty.as_str()) {
                None => errors.push(format!(
                    "src/lib.rs:{line}: {ty} is not a type of this test"
                )),
                Some(s) if s.size as u64 != size => errors.push(format!(
                    "src/lib.rs:{line}: {ty} is {} bytes, not {size}",
                    s.size
                )),
                Some(_) => {
                    headings.insert(ty, *line);
                }
            },
        }
    }
    for t in tables(&lines) {
        if t.header != ["offset", "size", "field", "meaning"] {
            continue;
        }
        let Some((line, h)) = &t.heading else {
            errors.push("a field table before any heading".into());
            continue;
        };
        let Some(Ok((ty, _))) = struct_heading(h) else {
            errors.push(format!(
                "src/lib.rs:{line}: a field table under a heading that names no `layout` type"
            ));
            continue;
        };
        let Some(s) = code.get(ty.as_str()) else {
            continue; // reported above
        };
        let seen = check_struct_table(&ty, s, &t, &mut errors);
        for f in &s.fields {
            if !seen.contains(f.name) {
                errors.push(format!(
                    "src/lib.rs:{line}: {ty}.{} is not documented",
                    f.name
                ));
            }
        }
        if documented.insert(ty.clone(), *line).is_some() {
            errors.push(format!("src/lib.rs:{line}: {ty} has two field tables"));
        }
    }
    for ty in code.keys() {
        if !documented.contains_key(*ty) {
            errors.push(format!("{ty} has no field table in the crate docs"));
        }
    }
    assert!(
        errors.is_empty(),
        "the spec disagrees with the code:\n{}",
        errors.join("\n")
    );
}

#[test]
fn the_section_kinds_are_the_directory() {
    let (_f, seg, cfg) = probe();
    let dir = directory(&seg);
    let g = *seg.geometry();
    let symbol = |s: &str| -> Option<u64> {
        Some(match s {
            "max_classes" => u64::from(cfg.max_classes),
            "max_strings" => u64::from(cfg.max_strings),
            "max_pages" => u64::from(cfg.max_pages),
            "history_long_len" => u64::from(cfg.history_long_len),
            "task_slots" => u64::from(cfg.task_slots),
            "page_size" => g.page_size as u64,
            _ => return None,
        })
    };
    let lines = doc_lines(LIB_RS);
    let mut errors = Vec::new();
    let mut kinds = BTreeSet::new();
    let header = ["kind", "section", "count", "stride", "content"];
    let all = tables(&lines);
    let table: Vec<_> = all.iter().filter(|t| t.header == header).collect();
    assert_eq!(table.len(), 1, "one section kind table");
    for (line, c) in &table[0].rows {
        let mut err = |m: String| errors.push(format!("src/lib.rs:{line}: {m}"));
        let Some(kind) = number(&c[0]).and_then(|k| u32::try_from(k).ok()) else {
            err(format!("kind {:?} is not a number", c[0]));
            continue;
        };
        kinds.insert(kind);
        let Some(k) = SectionKind::from_u32(kind) else {
            err(format!("kind {kind} is not a SectionKind"));
            continue;
        };
        if format!("{k:?}") != c[1] {
            err(format!("kind {kind} is {k:?}, not {}", c[1]));
        }
        let Some(&(_, count, stride)) = dir.get(&kind) else {
            err(format!("a new segment has no section of kind {kind}"));
            continue;
        };
        for (what, cell, actual) in [("count", &c[2], count), ("stride", &c[3], stride)] {
            let documented = number(cell).or_else(|| symbol(cell.trim_matches('`')));
            if documented != Some(actual) {
                err(format!("{k:?}: {what} is {actual}, the docs say {cell}"));
            }
        }
    }
    if kinds != dir.keys().copied().collect() {
        errors.push(format!(
            "documented kinds {kinds:?}, a new segment has {:?}",
            dir.keys().collect::<Vec<_>>()
        ));
    }
    // Lost counters by index.
    let header = ["index", "counter"];
    let table: Vec<_> = all.iter().filter(|t| t.header == header).collect();
    assert_eq!(table.len(), 1, "one lost counter table");
    let names: Vec<_> = table[0]
        .rows
        .iter()
        .map(|(_, c)| (number(&c[0]), c[1].trim_matches('`').to_string()))
        .collect();
    let code: Vec<_> = LostKind::ALL
        .iter()
        .map(|k| (Some(*k as u64), k.name().to_string()))
        .collect();
    if names != code {
        errors.push(format!(
            "lost counters: the docs say {names:?}, the code {code:?}"
        ));
    }
    assert!(
        errors.is_empty(),
        "the spec disagrees with the code:\n{}",
        errors.join("\n")
    );
}

#[test]
fn the_diagrams_are_the_code() {
    let code = code_structs();
    let (_f, seg, _cfg) = probe();
    let dir = directory(&seg);
    let lines = doc_lines(LIB_RS);
    let mut errors = Vec::new();
    let mut annotations = 0;
    for (line, text) in &lines {
        for (name, n) in size_annotations(text) {
            annotations += 1;
            match code.get(name.as_str()) {
                Some(s) if s.size as u64 == n => {}
                Some(s) => errors.push(format!(
                    "src/lib.rs:{line}: {name} is {} bytes, not {n}",
                    s.size
                )),
                None => errors.push(format!(
                    "src/lib.rs:{line}: \"{name} ({n} B\": name a `layout` type before a size"
                )),
            }
        }
    }
    assert!(annotations > 10, "the diagrams carry sizes ({annotations})");
    // Section boundaries in the file diagram: `0x1000 ├───` then `│ Name:`.
    let mut offsets = 0;
    for w in lines.windows(2) {
        let ((line, l), (_, next)) = (w[0], w[1]);
        let t = l.trim_start();
        if !(t.contains('┌') || t.contains('├')) {
            continue;
        }
        let first = t.split_whitespace().next().unwrap_or("");
        let off = if first == "offset" {
            t.split_whitespace().nth(1).and_then(number)
        } else {
            number(first)
        };
        let Some(off) = off else {
            continue;
        };
        let name: String = next
            .trim_start()
            .trim_start_matches('│')
            .trim_start()
            .chars()
            .take_while(char::is_ascii_alphanumeric)
            .collect();
        let actual = if name == "Header" {
            Some(0)
        } else {
            let kind = (1..=16)
                .find(|k| SectionKind::from_u32(*k).is_some_and(|s| format!("{s:?}") == name));
            kind.and_then(|k| dir.get(&k)).map(|e| e.0)
        };
        offsets += 1;
        if actual != Some(off) {
            errors.push(format!(
                "src/lib.rs:{line}: {name} starts at {actual:?}, not 0x{off:X}"
            ));
        }
    }
    assert!(
        offsets >= 3,
        "the file diagram marks section offsets ({offsets})"
    );
    assert!(
        errors.is_empty(),
        "the spec disagrees with the code:\n{}",
        errors.join("\n")
    );
}

#[test]
fn the_documented_version_is_the_code() {
    let mut errors = Vec::new();
    let version = format!("**{LAYOUT_MAJOR}.{LAYOUT_MINOR}**");
    let lib = doc_lines(LIB_RS);
    let stated: Vec<_> = lib
        .iter()
        .filter(|(_, l)| l.contains("Layout version **"))
        .collect();
    assert_eq!(stated.len(), 1, "the docs state the layout version once");
    if !stated[0].1.contains(&version) {
        errors.push(format!(
            "src/lib.rs:{}: the layout version is {version}",
            stated[0].0
        ));
    }
    // Any number right after "major" or "minor", in prose or in a table.
    for (file, src) in [("src/lib.rs", LIB_RS), ("src/layout.rs", LAYOUT_RS)] {
        for (line, text) in doc_lines(src) {
            let words: Vec<String> = text
                .split(|c: char| c.is_whitespace() || c == '|')
                .filter(|w| !w.is_empty())
                .map(|w| {
                    w.trim_matches(|c: char| !c.is_ascii_alphanumeric())
                        .to_lowercase()
                })
                .collect();
            for (i, w) in words.iter().enumerate() {
                let expect = match w.as_str() {
                    "major" => LAYOUT_MAJOR,
                    "minor" => LAYOUT_MINOR,
                    _ => continue,
                };
                let next = words[i + 1..].iter().take(2);
                for n in next.filter_map(|w| w.parse::<u32>().ok()) {
                    if n != expect {
                        errors.push(format!(
                            "{file}:{line}: {w} version {n}, the code's is {expect}"
                        ));
                    }
                }
            }
        }
    }
    assert!(
        errors.is_empty(),
        "the spec disagrees with the code:\n{}",
        errors.join("\n")
    );
}

/// The numbers above that the test itself takes from the code: a sanity
/// check that the probe segment really has distinct values.
#[test]
fn the_probe_segment_tells_symbols_apart() {
    let (_f, seg, cfg) = probe();
    let mut values = vec![
        u64::from(cfg.max_classes),
        u64::from(cfg.max_strings),
        u64::from(cfg.max_pages),
        u64::from(cfg.history_long_len),
        u64::from(cfg.task_slots),
        seg.geometry().page_size as u64,
        LOST_COUNTERS as u64,
        MAX_ACTORS as u64,
    ];
    values.sort_unstable();
    values.dedup();
    assert_eq!(values.len(), 8);
    assert!(u64::from(cfg.max_pages) < u64::from(MAX_PAGES));
}

/// The crate docs' value tables (class kinds; flag bits of classes, events,
/// threads and actors; consumer bits; page and record states) say what
/// the code's constants are: each list is rendered from the code and must
/// appear in the docs as it is.
#[test]
fn the_value_tables_are_the_code() {
    use pfs_shm_layout::{ClassKind, EventKind};
    let docs: String = doc_lines(LIB_RS)
        .into_iter()
        .map(|(_, l)| format!("{l}\n"))
        .collect();
    let mut missing = Vec::new();
    let mut expect = |what: &str, text: String| {
        if !docs.contains(&text) {
            missing.push(format!("{what}: {text:?}"));
        }
    };
    // Class kinds: each row's first name example has the row's value.
    let mut rows = 0;
    let table = docs
        .split("| value | kind | names |")
        .nth(1)
        .expect("the class kind table");
    for row in table.lines().skip(2).take_while(|l| l.starts_with('|')) {
        let c = cells(row);
        let value: u32 = c[0].parse().expect("a kind value");
        let example = c[2].split('`').nth(1).expect("a name example");
        let name = example.replace("...", "x");
        assert_eq!(
            ClassKind::from_name(&name).map(|k| k as u32),
            Some(value),
            "class kind row {row:?}: {name} has another kind in the code"
        );
        rows += 1;
    }
    assert_eq!(rows, 10, "one row per class kind");
    expect(
        "class entry flags",
        format!(
            "bit {} ENABLED, bit {} TIMED",
            FLAG_ENABLED.trailing_zeros(),
            FLAG_TIMED.trailing_zeros()
        ),
    );
    expect(
        "event row flags",
        format!(
            "{EV_TIMED} TIMED, {EV_ENDED} ENDED, {EV_HAS_BYTES} HAS_BYTES, {EV_HAS_SPINS} HAS_SPINS, {EV_HAS_PROGRESS} HAS_PROGRESS, {EV_CANCELLED} CANCELLED; timer in bits {}..={}",
            EV_TIMER_SHIFT,
            EV_TIMER_SHIFT + (EV_TIMER_MASK >> EV_TIMER_SHIFT).count_ones() - 1
        ),
    );
    expect(
        "event types",
        format!(
            "0 none, {} WAIT, {} STAGE, {} STATEMENT",
            EventKind::Wait as u32,
            EventKind::Stage as u32,
            EventKind::Statement as u32
        ),
    );
    expect(
        "thread flags",
        format!("{THREAD_INSTRUMENTED} INSTRUMENTED, {THREAD_HISTORY} HISTORY"),
    );
    expect(
        "actor flags",
        format!("{ACTOR_ENABLED} ENABLED, {ACTOR_HISTORY} HISTORY, {ACTOR_USED} USED"),
    );
    expect(
        "consumer bits",
        format!(
            "bit {} global_instrumentation, {} thread_instrumentation; kind *k* ([`EventKind::index`]: 0 waits, 1 stages, 2 statements) uses bits {}+{}*k*..",
            CONSUMER_GLOBAL.trailing_zeros(),
            CONSUMER_THREAD.trailing_zeros(),
            consumer_bit(EventKind::Wait, ConsumerKind::Current).trailing_zeros(),
            consumer_bit(EventKind::Stage, ConsumerKind::Current).trailing_zeros()
                - consumer_bit(EventKind::Wait, ConsumerKind::Current).trailing_zeros()
        ),
    );
    expect(
        "cpu consumer bit",
        format!(
            "bit {} (since 6.2) events_statements_cpu",
            CONSUMER_STATEMENTS_CPU.trailing_zeros()
        ),
    );
    expect(
        "page states",
        format!(
            "{PAGE_UNUSED} UNUSED (hole), {PAGE_ACTIVE} ACTIVE, {PAGE_RECLAIMING} RECLAIMING, {PAGE_RECLAIMED} RECLAIMED"
        ),
    );
    expect(
        "record states",
        format!("state {REC_FREE} FREE, {REC_DIRTY} DIRTY, {REC_ALLOCATED} ALLOCATED"),
    );
    assert!(
        missing.is_empty(),
        "the crate docs' value tables differ from the code:\n{}",
        missing.join("\n")
    );
}
