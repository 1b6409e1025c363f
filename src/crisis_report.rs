//! `companion report crisis --year`: the year's crisis flags and referrals by month and category, as a
//! company publishes them. Read from `crisis_log`, which holds no user, conversation or message id, so
//! the counts survive a user's erasure.
//!
//! `companion report crisis-lines`: the review sheet of the crisis lines (docs/safety.md, section 6),
//! every line with its evidence, those due for review first.

use std::{collections::BTreeMap, fmt::Write};

use chrono::NaiveDate;

use crate::safety::{CrisisLine, CrisisLines};
use crate::store::CrisisMonth;

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

/// The crisis lines as a reviewer checks them: due ones (checked more than `review_days` before
/// `today`) first, then by country; each with how to reach it, what it is, when it is open, what it costs,
/// where and when that was checked, and what no source showed. `json`: one JSON object.
pub(crate) fn crisis_lines(
    lines: &CrisisLines,
    today: NaiveDate,
    review_days: u32,
    json: bool,
) -> String {
    let age = |l: &CrisisLine| (today - l.checked).num_days();
    let due = |l: &CrisisLine| age(l) > i64::from(review_days);
    let mut entries: Vec<(&str, &CrisisLine)> = lines.entries().collect();
    entries.sort_by_key(|(whose, l)| (!due(l), *whose));
    let n_due = entries.iter().filter(|(_, l)| due(l)).count();
    if json {
        let rows: Vec<serde_json::Value> = entries
            .iter()
            .map(|(whose, l)| {
                serde_json::json!({
                    "country": whose, "name": l.name, "phone": l.phone, "text": l.text, "url": l.url,
                    "kind": l.kind, "serves": l.serves, "hours": l.hours, "cost": l.cost,
                    "source": l.source, "checked": l.checked, "daysSinceChecked": age(l), "due": due(l),
                    "evidence": l.evidence, "unconfirmed": l.unconfirmed,
                })
            })
            .collect();
        let value = serde_json::json!({
            "today": today, "reviewDays": review_days, "due": n_due, "lines": rows,
            "reviewed": lines.reviewed,
        });
        return format!("{value}\n");
    }
    let mut out = format!(
        "crisis lines: {} entries in {} countries and the directory; {n_due} due for review (checked more than {review_days} days before {today})\n{}\n",
        entries.len(),
        lines.countries.len(),
        lines.reviewed.trim(),
    );
    for (whose, l) in entries {
        let serves: Vec<&str> = l.serves.iter().map(|c| c.as_str()).collect();
        let ways: Vec<String> = [("phone", &l.phone), ("text", &l.text), ("url", &l.url)]
            .into_iter()
            .filter_map(|(what, v)| v.as_ref().map(|v| format!("{what} {v}")))
            .collect();
        let _ = writeln!(
            out,
            "\n{}{whose}  {}  [{} for {}]",
            if due(l) { "DUE " } else { "" },
            l.name,
            l.kind.as_str(),
            serves.join(", ")
        );
        let _ = writeln!(out, "    {}", ways.join(" · "));
        let _ = writeln!(out, "    hours: {} · cost: {}", l.hours, l.cost);
        let _ = writeln!(
            out,
            "    checked {} ({} days ago) at {}",
            l.checked,
            age(l),
            l.source
        );
        if let Some(u) = &l.unconfirmed {
            let _ = writeln!(out, "    unconfirmed: {u}");
        }
    }
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

    #[test]
    fn the_review_sheet_puts_due_lines_first() {
        let lines = CrisisLines::builtin();
        let today = NaiveDate::from_ymd_opt(2026, 12, 1).unwrap();
        let sheet = crisis_lines(&lines, today, 365, false);
        assert!(sheet.contains(" 0 due for review"), "{sheet}");
        assert!(!sheet.contains("\nDUE "), "{sheet}");
        assert!(
            sheet.contains("\nJP  いのちの電話（ナビダイヤル）"),
            "{sheet}"
        );
        let later = NaiveDate::from_ymd_opt(2027, 12, 1).unwrap();
        let sheet = crisis_lines(&lines, later, 365, false);
        let first = sheet
            .lines()
            .find(|l| l.starts_with("DUE ") || l.starts_with("directory"));
        assert!(first.is_some_and(|l| l.starts_with("DUE ")), "{sheet}");
        let json: serde_json::Value =
            serde_json::from_str(&crisis_lines(&lines, later, 365, true)).unwrap();
        let rows = json["lines"].as_array().unwrap();
        assert_eq!(json["due"].as_u64(), Some(rows.len() as u64));
        assert!(
            rows.iter()
                .all(|r| r["source"].as_str().is_some_and(|s| s.starts_with("http")))
        );
    }
}
