//! In-use memory, the collector's side: the tracked objects its allocation samples named
//! (`allocations/inuse.rs`), kept until their entries say they were freed, and summed by
//! (stack, labels) at each hand-over.
//!
//! An object is keyed by its entry, so there are at most
//! [`ENTRIES`](crate::allocations::inuse::ENTRIES) (6,080) at once, each with its boxed
//! stack (8 bytes a frame): under 6 MiB at the deepest stacks. A sample drained after its
//! object was freed (a short-lived object between two drains) is never kept.

use std::collections::HashMap;

use super::{label_key, LabelKey, Totals};
use crate::allocations::inuse::{self, Tracked};
use crate::allocations::AllocRecord;

/// One stack's in-use totals: the (objects, bytes) its live sampled objects stand for.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct InuseTotals {
    pub(super) objects: f64,
    pub(super) bytes: f64,
}

struct Live {
    tracked: Tracked,
    frames: Box<[u64]>,
    labels: LabelKey,
    objects: f64,
    bytes: f64,
}

/// The live tracked objects, by entry.
#[derive(Default)]
pub(super) struct LiveObjects {
    objects: HashMap<usize, Live>,
}

impl LiveObjects {
    /// Keeps the object a drained sample names, if it is tracked and still alive.
    pub(super) fn add(&mut self, record: &AllocRecord) {
        let Some(tracked) = record.tracked else {
            return;
        };
        if !inuse::alive(tracked) {
            return;
        }
        self.objects.insert(
            tracked.index(),
            Live {
                tracked,
                frames: Box::from(record.stack.frames()),
                labels: label_key(record.stack.root),
                objects: record.objects,
                bytes: record.bytes,
            },
        );
    }

    /// Forgets the objects freed since, and sums the others by (stack, labels). `None`
    /// while tracking is off and nothing tracked is alive (the profile keeps its
    /// allocation-only shape).
    pub(super) fn totals(&mut self) -> Option<Totals<InuseTotals>> {
        self.objects.retain(|_, live| inuse::alive(live.tracked));
        if self.objects.is_empty() && !inuse::tracking() {
            return None;
        }
        let mut totals: Totals<InuseTotals> = HashMap::new();
        for live in self.objects.values() {
            let total = totals
                .entry((live.frames.clone(), live.labels))
                .or_default();
            total.objects += live.objects;
            total.bytes += live.bytes;
        }
        Some(totals)
    }
}
