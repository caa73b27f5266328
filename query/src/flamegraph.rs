//! Pyroscope's flame graph (`querier.v1.FlameGraph`), decoded.

use std::collections::BTreeMap;

use serde_json::Value;

/// One node with its absolute position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlameNode {
    /// Depth (0 = "total").
    pub level: usize,
    /// Absolute x offset.
    pub x: i64,
    /// Total value (self + children).
    pub total: i64,
    /// Self value.
    pub self_value: i64,
    /// Function name.
    pub name: String,
}

/// A decoded flame graph.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlameGraph {
    /// Nodes level by level, left to right.
    pub nodes: Vec<FlameNode>,
    /// Sum of all values (ns for CPU).
    pub total: i64,
    /// Largest self value.
    pub max_self: i64,
}

fn json_i64(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

impl FlameGraph {
    /// Decodes `{"names": [...], "levels": [{"values": [...]}], "total", "maxSelf"}`, whose
    /// level values are quadruplets `[x offset relative to the previous node's end, total,
    /// self, name index]` (int64 as strings or numbers).
    pub fn from_json(v: &Value) -> Result<FlameGraph, String> {
        let bad = |m: &str| format!("flame graph: {m}");
        if v.is_null() {
            return Ok(FlameGraph::default());
        }
        let names: Vec<String> = v
            .get("names")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|n| n.as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default();
        let mut nodes = Vec::new();
        for (level, lv) in v
            .get("levels")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let values: Vec<i64> = lv
                .get("values")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(json_i64).collect::<Option<Vec<_>>>())
                .unwrap_or(Some(Vec::new()))
                .ok_or_else(|| bad("non-integer level value"))?;
            if !values.len().is_multiple_of(4) {
                return Err(bad("level values are not quadruplets"));
            }
            let mut end = 0;
            for q in values.chunks(4) {
                let x = end + q[0];
                let name = names
                    .get(usize::try_from(q[3]).unwrap_or(usize::MAX))
                    .ok_or_else(|| bad("name index out of range"))?
                    .clone();
                nodes.push(FlameNode {
                    level,
                    x,
                    total: q[1],
                    self_value: q[2],
                    name,
                });
                end = x + q[1];
            }
        }
        Ok(FlameGraph {
            nodes,
            total: v.get("total").and_then(json_i64).unwrap_or(0),
            max_self: v.get("maxSelf").and_then(json_i64).unwrap_or(0),
        })
    }

    /// Every stack with a self value: function names root first (without the "total"
    /// node), and the self value. A node's parent is the node one level up whose span
    /// `[x, x + total)` holds it.
    pub fn stacks(&self) -> Vec<(Vec<String>, i64)> {
        // Per level, the nodes' (x, end, path) — levels come in order, left to right.
        let mut previous: Vec<(i64, i64, Vec<String>)> = Vec::new();
        let mut current: Vec<(i64, i64, Vec<String>)> = Vec::new();
        let mut level = 0;
        let mut out = Vec::new();
        for node in &self.nodes {
            if node.level != level {
                previous = std::mem::take(&mut current);
                level = node.level;
            }
            let path = if node.level == 0 {
                Vec::new()
            } else {
                let Some((_, _, parent)) = previous
                    .iter()
                    .find(|(x, end, _)| node.x >= *x && node.x < *end)
                else {
                    continue;
                };
                let mut path = parent.clone();
                path.push(node.name.clone());
                path
            };
            if node.self_value > 0 && !path.is_empty() {
                out.push((path.clone(), node.self_value));
            }
            current.push((node.x, node.x + node.total, path));
        }
        out
    }

    /// Whether the graph holds no samples.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Total value of the frames whose name contains `needle`, counting a recursive
    /// function once (only its outermost frames).
    pub fn function_total(&self, needle: &str) -> i64 {
        let mut covered: Vec<(i64, i64)> = Vec::new();
        let mut sum = 0;
        for node in &self.nodes {
            if node.level == 0 || !node.name.contains(needle) {
                continue;
            }
            let inside = covered
                .iter()
                .any(|&(x, end)| node.x >= x && node.x + node.total <= end);
            if !inside {
                covered.push((node.x, node.x + node.total));
                sum += node.total;
            }
        }
        sum
    }

    /// The function with the largest self value, with that value.
    pub fn top_function(&self) -> Option<(String, i64)> {
        let mut by_name: BTreeMap<&str, i64> = BTreeMap::new();
        for node in self.nodes.iter().filter(|n| n.level > 0) {
            *by_name.entry(&node.name).or_default() += node.self_value;
        }
        by_name
            .into_iter()
            .max_by_key(|(_, v)| *v)
            .filter(|(_, v)| *v > 0)
            .map(|(n, v)| (n.to_string(), v))
    }

    /// The function with the largest total among those whose name contains `needle_any`
    /// of the given prefixes (e.g. the workload's own functions).
    pub fn top_function_matching(&self, needles: &[&str]) -> Option<(String, i64)> {
        let mut by_name: BTreeMap<&str, i64> = BTreeMap::new();
        for node in self.nodes.iter().filter(|n| n.level > 0) {
            if needles.iter().any(|n| node.name.contains(n)) {
                by_name
                    .entry(&node.name)
                    .or_insert_with(|| self.function_total(&node.name));
            }
        }
        by_name
            .into_iter()
            .max_by_key(|(_, v)| *v)
            .map(|(n, v)| (n.to_string(), v))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn stacks_follow_the_x_ranges() {
        // total(10) -> main(10, self 1) -> {a(6, self 6), b(3) -> c(3, self 3)}
        let graph = FlameGraph::from_json(&json!({
            "names": ["total", "main", "a", "b", "c"],
            "levels": [
                {"values": ["0", "10", "0", "0"]},
                {"values": ["0", "10", "1", "1"]},
                {"values": ["0", "6", "6", "2", "0", "3", "0", "3"]},
                {"values": ["6", "3", "3", "4"]},
            ],
            "total": "10", "maxSelf": "6",
        }))
        .unwrap();
        let mut stacks = graph.stacks();
        stacks.sort();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            stacks,
            vec![
                (s(&["main"]), 1),
                (s(&["main", "a"]), 6),
                (s(&["main", "b", "c"]), 3)
            ]
        );
        assert_eq!(graph.function_total("b"), 3);
        assert_eq!(graph.top_function(), Some(("a".into(), 6)));
    }
}
