//! CPU per function: self time (the innermost frame) and total time (anywhere on the stack).

use std::collections::HashMap;
use std::sync::Arc;

use crate::input::Sample;

/// The frame name given to samples without a stack.
pub const NO_STACK: &str = "[no stack]";

/// A function with the CPU time attributed to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionCpu {
    /// Function name (demangled, as in the profile).
    pub function: String,
    /// CPU time, nanoseconds.
    pub cpu_ns: u64,
}

/// Self and total CPU per function over a set of samples.
#[derive(Clone, Debug, Default)]
pub(crate) struct FunctionTotals {
    self_ns: HashMap<Arc<str>, u64>,
    total_ns: HashMap<Arc<str>, u64>,
    /// Deepest position seen from the outermost frame (0): breaks ties in favour of the
    /// frames nearer the work (the handler rather than the thread's entry point).
    depth: HashMap<Arc<str>, usize>,
}

impl FunctionTotals {
    /// Adds one sample: its CPU counts as self time of its innermost frame and as total
    /// time of every function on its stack, once even when the function recurses.
    pub(crate) fn add(&mut self, sample: &Sample) {
        let no_stack: Arc<str> = Arc::from(NO_STACK);
        let innermost = sample.frames.first().unwrap_or(&no_stack);
        *self.self_ns.entry(innermost.clone()).or_default() += sample.cpu_ns;
        let mut on_stack: Vec<&Arc<str>> = if sample.frames.is_empty() {
            vec![&no_stack]
        } else {
            sample.frames.iter().collect()
        };
        on_stack.sort_unstable();
        on_stack.dedup();
        for function in on_stack {
            *self.total_ns.entry(function.clone()).or_default() += sample.cpu_ns;
        }
        for (depth, function) in sample.frames.iter().rev().enumerate() {
            let deepest = self.depth.entry(function.clone()).or_default();
            *deepest = (*deepest).max(depth);
        }
    }

    /// Self CPU of `function`.
    pub(crate) fn self_ns(&self, function: &str) -> u64 {
        self.self_ns.get(function).copied().unwrap_or(0)
    }

    /// Total CPU of `function`.
    pub(crate) fn total_ns(&self, function: &str) -> u64 {
        self.total_ns.get(function).copied().unwrap_or(0)
    }

    /// Every function seen.
    pub(crate) fn functions(&self) -> impl Iterator<Item = &Arc<str>> {
        self.total_ns.keys()
    }

    /// The `n` functions with the most self CPU, most first.
    pub(crate) fn top_self(&self, n: usize) -> Vec<FunctionCpu> {
        self.top(&self.self_ns, n)
    }

    /// The `n` functions with the most total CPU, most first; among equals, the deepest
    /// on the stack first (many frames of a thread's entry hold 100 %).
    pub(crate) fn top_total(&self, n: usize) -> Vec<FunctionCpu> {
        self.top(&self.total_ns, n)
    }

    /// Most CPU first, then deepest first, then by name.
    fn top(&self, map: &HashMap<Arc<str>, u64>, n: usize) -> Vec<FunctionCpu> {
        let mut all: Vec<(&Arc<str>, u64, usize)> = map
            .iter()
            .filter(|(_, &ns)| ns > 0)
            .map(|(f, &ns)| (f, ns, self.depth.get(f).copied().unwrap_or(0)))
            .collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.cmp(&a.2)).then(a.0.cmp(b.0)));
        all.into_iter()
            .take(n)
            .map(|(f, ns, _)| FunctionCpu {
                function: f.to_string(),
                cpu_ns: ns,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(frames: &[&str], cpu_ns: u64) -> Sample {
        Sample {
            frames: frames.iter().map(|f| Arc::from(*f)).collect(),
            cpu_ns,
            count: 1,
            span_id: None,
            trace_id: None,
            span_name: None,
        }
    }

    #[test]
    fn self_is_innermost_and_total_counts_recursion_once() {
        let mut totals = FunctionTotals::default();
        totals.add(&sample(&["leaf", "rec", "rec", "main"], 10));
        totals.add(&sample(&["rec", "main"], 5));
        totals.add(&sample(&[], 1));
        assert_eq!(totals.self_ns("leaf"), 10);
        assert_eq!(totals.self_ns("rec"), 5);
        assert_eq!(totals.total_ns("rec"), 15);
        assert_eq!(totals.total_ns("main"), 15);
        assert_eq!(totals.self_ns(NO_STACK), 1);
        // main and rec tie at 15: the deeper one comes first.
        let top = totals.top_total(2);
        assert_eq!(top[0].function, "rec");
        assert_eq!(top[1].function, "main");
        assert_eq!(totals.top_self(1)[0].function, "leaf");
    }
}
