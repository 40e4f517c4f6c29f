//! The Prometheus text format's pieces: a family's HELP and TYPE lines, a
//! sample line, label escaping, and a whole counter schema as families.
//!
//! Invariant: label values are escaped (`\\`, `"`, newline) and every
//! family is written once, its samples after it.

use std::fmt::Write;

use proto::switch::CounterSchema;

pub(super) fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value with `\`, `"` and newlines escaped (the text format's rule).
pub(super) fn esc(v: &str) -> String {
    let mut o = String::with_capacity(v.len());
    for ch in v.chars() {
        match ch {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

pub(super) fn sample(out: &mut String, name: &str, labels: &str, v: impl std::fmt::Display) {
    if labels.is_empty() {
        let _ = writeln!(out, "{name} {v}");
    } else {
        let _ = writeln!(out, "{name}{{{labels}}} {v}");
    }
}

/// `(name, help, value)` of one counter.
type Counter = (&'static str, &'static str, u64);

/// Every counter of a schema, in its order.
fn values(c: &dyn CounterSchema) -> Vec<Counter> {
    let mut v = Vec::new();
    c.visit(&mut |name, help, value| v.push((name, help, value)));
    v
}

/// One counter family per counter of schema `T`, named
/// `{prefix}{counter}_total`, with one sample per `(labels, counters)` row.
pub(super) fn schema_families<T: CounterSchema + Default>(
    out: &mut String,
    prefix: &str,
    rows: &[(String, &T)],
) {
    let rows: Vec<(&str, Vec<Counter>)> = rows
        .iter()
        .map(|(labels, c)| (labels.as_str(), values(*c)))
        .collect();
    for (i, (counter, help, _)) in values(&T::default()).into_iter().enumerate() {
        let name = format!("{prefix}{counter}_total");
        family(out, &name, "counter", help);
        for (labels, vals) in &rows {
            sample(out, &name, labels, vals[i].2);
        }
    }
}
