//! The report endpoint's work: build rows, serialize the response.
//!
//! Two versions of the serializer: `v1` serializes the report once. `paged` (the regressed
//! release) splits the response into pages and, to find each page's byte offset, serializes
//! the whole report again for every page: the same bytes out, about 8× the CPU.

use serde::Serialize;

/// Pages the regressed serializer re-serializes the report for.
pub const PAGES: usize = 8;

/// One line of the report.
#[derive(Serialize, Clone, Debug)]
pub struct Row {
    id: u64,
    customer: String,
    region: &'static str,
    amount_cents: i64,
    items: Vec<Item>,
}

/// One item of a row.
#[derive(Serialize, Clone, Debug)]
pub struct Item {
    sku: String,
    quantity: u32,
    unit_price_cents: i64,
}

/// Which serializer the service runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serializer {
    /// Serialize once (healthy).
    V1,
    /// Re-serialize per page (the regression).
    Paged,
}

impl Serializer {
    /// From `v1` / `paged`.
    pub fn parse(s: &str) -> Option<Serializer> {
        match s {
            "v1" => Some(Serializer::V1),
            "paged" => Some(Serializer::Paged),
            _ => None,
        }
    }
}

/// Deterministic report rows.
pub fn build_rows(n: usize) -> Vec<Row> {
    const REGIONS: [&str; 4] = ["eu-west", "us-east", "ap-south", "sa-east"];
    (0..n as u64)
        .map(|id| Row {
            id,
            customer: format!("customer-{:06}", id * 7919 % 1_000_003),
            region: REGIONS[(id % 4) as usize],
            amount_cents: (id as i64 * 1237) % 100_000,
            items: (0..4)
                .map(|k| Item {
                    sku: format!("SKU-{:05}-{k}", id % 50_000),
                    quantity: (k + 1) as u32,
                    unit_price_cents: 199 + k as i64 * 100,
                })
                .collect(),
        })
        .collect()
}

/// Serializes the whole report as JSON.
#[inline(never)]
pub fn serialize_report(rows: &[Row]) -> String {
    serde_json::to_string(rows).unwrap_or_default()
}

/// The regressed pagination: re-serializes everything to find each page's offset.
#[inline(never)]
pub fn paginate_report(rows: &[Row]) -> String {
    let mut body = String::new();
    for page in 0..PAGES {
        let whole = serialize_report(rows);
        let _offset = whole.len() * page / PAGES;
        body = whole;
    }
    body
}

/// Renders the response body with the chosen serializer.
pub fn render(serializer: Serializer, rows: &[Row]) -> String {
    match serializer {
        Serializer::V1 => serialize_report(rows),
        Serializer::Paged => paginate_report(rows),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_versions_give_the_same_bytes() {
        let rows = build_rows(50);
        assert_eq!(
            render(Serializer::V1, &rows),
            render(Serializer::Paged, &rows)
        );
        assert!(render(Serializer::V1, &rows).starts_with("[{\"id\":0,"));
    }
}
