//! `companion report crisis --year`: the year's crisis flags and referrals by month and category, as a
//! company publishes them. Read from `crisis_log`, which holds no user, conversation or message id, so
//! the counts survive a user's erasure.

use std::{collections::BTreeMap, fmt::Write};

use crate::store::safety::CrisisMonth;

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// The report as a table (or one JSON object with `json`).
pub(crate) fn crisis(year: i32, rows: &[CrisisMonth], json: bool) -> String {
    if json {
        let total: i64 = rows.iter().map(|r| r.referred).sum();
        let flagged: i64 = rows.iter().map(|r| r.flagged).sum();
        let value = serde_json::json!({
            "year": year, "flagged": flagged, "referrals": total, "byMonth": rows,
        });
        return format!("{value}\n");
    }
    let categories: Vec<&str> = {
        let mut c: Vec<&str> = rows.iter().map(|r| r.category.as_str()).collect();
        c.sort_unstable();
        c.dedup();
        c
    };
    let mut out =
        format!("crisis referrals {year} (flagged messages in brackets), by month and category\n");
    let _ = write!(out, "{:<6}", "month");
    for c in &categories {
        let _ = write!(out, "{c:>16}");
    }
    let _ = writeln!(out, "{:>16}", "all");
    let by: BTreeMap<(u32, &str), &CrisisMonth> = rows
        .iter()
        .map(|r| ((r.month, r.category.as_str()), r))
        .collect();
    let cell = |referred: i64, flagged: i64| format!("{referred} ({flagged})");
    let (mut all_referred, mut all_flagged) = (0, 0);
    for (m, name) in MONTHS.iter().enumerate() {
        let month = m as u32 + 1;
        let _ = write!(out, "{name:<6}");
        let (mut referred, mut flagged) = (0, 0);
        for c in &categories {
            let (r, f) = by
                .get(&(month, *c))
                .map(|r| (r.referred, r.flagged))
                .unwrap_or_default();
            referred += r;
            flagged += f;
            let _ = write!(out, "{:>16}", cell(r, f));
        }
        let _ = writeln!(out, "{:>16}", cell(referred, flagged));
        all_referred += referred;
        all_flagged += flagged;
    }
    let _ = writeln!(
        out,
        "year: {all_referred} referrals, {all_flagged} flagged messages"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_sums_months_and_categories() {
        let rows = vec![
            CrisisMonth {
                month: 3,
                category: "self_harm".into(),
                flagged: 4,
                referred: 2,
            },
            CrisisMonth {
                month: 3,
                category: "abuse".into(),
                flagged: 1,
                referred: 1,
            },
        ];
        let table = crisis(2026, &rows, false);
        assert!(table.contains("Mar"), "{table}");
        assert!(table.contains("3 (5)"), "{table}");
        assert!(
            table.ends_with("year: 3 referrals, 5 flagged messages\n"),
            "{table}"
        );
    }
}
