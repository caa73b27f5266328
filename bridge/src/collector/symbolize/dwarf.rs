//! File, line and inline chain of addresses, from DWARF read straight from the mapped
//! file, one naming pass at a time.
//!
//! What stays in memory between passes is a [`UnitIndex`]: the address ranges of every
//! compile unit and where each unit starts. A pass groups its new addresses by unit and,
//! for each unit, walks its entries once (the `DW_TAG_subprogram` covering each address,
//! and the `DW_TAG_inlined_subroutine`s nested in it that cover it too) and runs its line
//! program once (the row covering each address); names that live in another unit
//! (`DW_FORM_ref_addr`) are read from that unit's header and that one entry. Everything
//! parsed is dropped when the unit is done.
//!
//! The answers are the ones `addr2line` gives (a test compares them): the same unit
//! preference (`DW_AT_ranges`, then `.debug_aranges`, then `DW_AT_low_pc`/`high_pc`, then
//! line sequences), the same names (`DW_AT_linkage_name` over `DW_AT_name`, following
//! `DW_AT_abstract_origin`/`DW_AT_specification` up to 16 times), the same rows (the last
//! row at the highest address at or below the address) and the same paths (the unit's
//! directory, the file's directory, the file name; an absolute part replaces what is
//! before it). Where DWARF is malformed (overlapping functions, decreasing rows), either
//! side may pick another candidate. Compressed debug sections are not read (the file is
//! then named from its symbols).

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use gimli::AttributeValue;

use crate::pprof::FrameLine;

pub(super) type Slice<'a> = gimli::EndianSlice<'a, gimli::RunTimeEndian>;
type Dwarf<'a> = gimli::Dwarf<Slice<'a>>;
type Unit<'a> = gimli::Unit<Slice<'a>>;
type UnitRef<'u, 'a> = gimli::UnitRef<'u, Slice<'a>>;

/// What reading one unit's header, root entry, abbreviations and line program header
/// touches beside its entries: a few scattered pages.
const PAGES_PER_UNIT: u64 = 16 << 10;

/// The DWARF sections of an object, borrowed from its mapping; `None` without
/// `.debug_info` or with a section that cannot be read in place (compressed).
pub(super) fn load<'a>(object: &object::File<'a>) -> Option<Dwarf<'a>> {
    use object::Object;
    object.section_by_name(".debug_info")?;
    gimli::Dwarf::load(sections(object, false)).ok()
}

/// Reads section `id` of `object` in place: its `.dwo` name in a split file (`dwo`), a
/// missing section as empty, a compressed one as an error.
fn sections<'o, 'a>(
    object: &'o object::File<'a>,
    dwo: bool,
) -> impl FnMut(gimli::SectionId) -> Result<Slice<'a>, gimli::Error> + 'o {
    use object::{Object, ObjectSection};
    let endian = if object.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    move |id| {
        let name = if dwo { id.dwo_name() } else { Some(id.name()) };
        let data = match name.and_then(|n| object.section_by_name(n)) {
            Some(section) => match section.uncompressed_data() {
                Ok(std::borrow::Cow::Borrowed(data)) => data,
                _ => return Err(gimli::Error::Io),
            },
            None => &[],
        };
        Ok(gimli::EndianSlice::new(data, endian))
    }
}

/// Where the entries of a file's skeleton units are (`split-debuginfo`): its DWARF
/// package, else each unit's `.dwo` file.
pub(super) struct SplitSource<'a> {
    pub(super) files: &'a super::split::SplitFiles,
    /// The binary's `.dwp` path.
    pub(super) package: std::path::PathBuf,
}

/// The compile units of a file and the addresses they cover. Kept per file between
/// passes: 32 bytes per range (adjacent ranges of one unit merged) and 16 per unit.
#[derive(Default)]
pub(super) struct UnitIndex {
    /// Sorted by (end, unit); `min_begin` is the lowest `begin` of this entry and every
    /// later one, so the units covering an address are a short scan from the first range
    /// ending after it (overlaps are rare but exist: weak symbols).
    ranges: Vec<UnitRange>,
    /// Units that ranges or references lead to (compile and partial units), by offset.
    units: Vec<UnitEntry>,
}

struct UnitRange {
    begin: u64,
    end: u64,
    min_begin: u64,
    unit: u32,
}

struct UnitEntry {
    /// Offset of the unit header in `.debug_info`.
    offset: usize,
    /// `DW_AT_language` of the unit: it decides how names demangle.
    lang: Option<gimli::DwLang>,
}

impl UnitIndex {
    /// Reads every unit header and root entry once, telling `touch` about how many bytes
    /// of the file each read.
    pub(super) fn build(dwarf: &Dwarf<'_>, touch: &dyn Fn(u64)) -> UnitIndex {
        let mut aranges = Vec::new();
        let mut headers = dwarf.debug_aranges.headers();
        while let Ok(Some(header)) = headers.next() {
            aranges.push((header.debug_info_offset().0, header.offset()));
        }
        aranges.sort_unstable_by_key(|a| a.0);

        let mut index = UnitIndex::default();
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        let mut units = dwarf.units();
        while let Ok(Some(header)) = units.next() {
            touch(PAGES_PER_UNIT);
            let Some(offset) = header.debug_info_offset() else {
                continue;
            };
            let wants_ranges = match header.type_() {
                gimli::UnitType::Type { .. } | gimli::UnitType::SplitType { .. } => continue,
                gimli::UnitType::Partial => false,
                _ => true,
            };
            let Ok(unit) = dwarf.unit(header) else {
                continue;
            };
            let unit_ref = gimli::UnitRef::new(dwarf, &unit);
            let Ok(id) = u32::try_from(index.units.len()) else {
                break;
            };
            ranges.clear();
            let mut lang = None;
            if wants_ranges {
                lang = unit_ranges(unit_ref, offset.0, &aranges, &mut ranges);
            }
            index.units.push(UnitEntry {
                offset: offset.0,
                lang,
            });
            ranges.sort_unstable();
            let mut merged: Option<(u64, u64)> = None;
            for &(begin, end) in ranges.iter() {
                match &mut merged {
                    Some((_, e)) if begin <= *e => *e = (*e).max(end),
                    _ => {
                        if let Some((b, e)) = merged.replace((begin, end)) {
                            index.ranges.push(UnitRange {
                                begin: b,
                                end: e,
                                min_begin: 0,
                                unit: id,
                            });
                        }
                    }
                }
            }
            if let Some((begin, end)) = merged {
                index.ranges.push(UnitRange {
                    begin,
                    end,
                    min_begin: 0,
                    unit: id,
                });
            }
        }
        index.ranges.sort_unstable_by_key(|r| (r.end, r.unit));
        let mut min = u64::MAX;
        for r in index.ranges.iter_mut().rev() {
            min = min.min(r.begin);
            r.min_begin = min;
        }
        index.ranges.shrink_to_fit();
        index.units.shrink_to_fit();
        index
    }

    /// Bytes this index keeps on the heap.
    #[cfg(test)]
    pub(super) fn heap_bytes(&self) -> usize {
        self.ranges.capacity() * std::mem::size_of::<UnitRange>()
            + self.units.capacity() * std::mem::size_of::<UnitEntry>()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The `k`-th unit (in index order) whose ranges cover `probe`.
    fn candidate(&self, probe: u64, k: usize) -> Option<u32> {
        let start = self.ranges.partition_point(|r| r.end <= probe);
        self.ranges[start..]
            .iter()
            .take_while(|r| probe >= r.min_begin)
            .filter(|r| r.begin <= probe && probe < r.end)
            .map(|r| r.unit)
            .nth(k)
    }

    /// The unit containing `.debug_info` offset `offset`.
    fn unit_at(&self, offset: usize) -> Option<&UnitEntry> {
        match self.units.binary_search_by_key(&offset, |u| u.offset) {
            // No entry is at a unit's own offset (its header is).
            Ok(_) | Err(0) => None,
            Err(i) => self.units.get(i - 1),
        }
    }
}

/// `DW_AT_language` of the unit's root entry.
fn root_language(unit: UnitRef<'_, '_>) -> Option<gimli::DwLang> {
    let mut entries = unit.entries_raw(None).ok()?;
    let abbrev = entries.read_abbreviation().ok()??;
    for spec in abbrev.attributes() {
        let attr = entries.read_attribute(*spec).ok()?;
        if let (gimli::DW_AT_language, AttributeValue::Language(l)) = (attr.name(), attr.value()) {
            return Some(l);
        }
    }
    None
}

/// The ranges a compile unit covers, into `out`; returns its language.
fn unit_ranges(
    unit: UnitRef<'_, '_>,
    offset: usize,
    aranges: &[(usize, gimli::DebugArangesOffset<usize>)],
    out: &mut Vec<(u64, u64)>,
) -> Option<gimli::DwLang> {
    let mut lang = None;
    let Ok(mut entries) = unit.entries_raw(None) else {
        return None;
    };
    let Ok(Some(abbrev)) = entries.read_abbreviation() else {
        return None;
    };
    let mut attrs = Ranges::default();
    for spec in abbrev.attributes() {
        let Ok(attr) = entries.read_attribute(*spec) else {
            return None;
        };
        if attr.name() == gimli::DW_AT_language {
            if let AttributeValue::Language(l) = attr.value() {
                lang = Some(l);
            }
        } else {
            attrs.add(unit, &attr);
        }
    }
    // Preference as addr2line has it: DW_AT_ranges, then .debug_aranges, then low/high pc.
    let mut found = false;
    if attrs.ranges.is_none() {
        let first = aranges.partition_point(|a| a.0 < offset);
        for (_, at) in aranges[first..].iter().take_while(|a| a.0 == offset) {
            let Ok(header) = unit.dwarf.debug_aranges.header(*at) else {
                continue;
            };
            let mut entries = header.entries();
            loop {
                match entries.next() {
                    Ok(Some(entry)) => {
                        if entry.length() != 0 {
                            let range = entry.range();
                            out.push((range.begin, range.end));
                            found = true;
                        }
                    }
                    Ok(None) => break,
                    // Ignored like addr2line does (address overflow seen from rustc).
                    Err(_) => continue,
                }
            }
        }
    }
    if !found {
        found = attrs.for_each(unit, |b, e| out.push((b, e)));
    }
    if !found {
        // No declared ranges: the line program's sequences say what the unit covers.
        if let Some(program) = unit.line_program.clone() {
            let mut rows = program.rows();
            let mut start = None;
            while let Ok(Some((_, row))) = rows.next_row() {
                if row.end_sequence() {
                    if let Some(start) = start.take() {
                        if start < row.address() {
                            out.push((start, row.address()));
                        }
                    }
                } else if start.is_none() {
                    start = Some(row.address());
                }
            }
        }
    }
    lang
}

/// The address attributes of an entry.
#[derive(Default)]
struct Ranges {
    low: Option<u64>,
    high: Option<u64>,
    size: Option<u64>,
    ranges: Option<gimli::RangeListsOffset<usize>>,
}

impl Ranges {
    /// Records `attr` if it is one of the address attributes.
    fn add<'a>(&mut self, unit: UnitRef<'_, 'a>, attr: &gimli::Attribute<Slice<'a>>) {
        match (attr.name(), attr.value()) {
            (gimli::DW_AT_low_pc, AttributeValue::Addr(a)) => self.low = Some(a),
            (gimli::DW_AT_low_pc, AttributeValue::DebugAddrIndex(i)) => {
                self.low = unit.address(i).ok()
            }
            (gimli::DW_AT_high_pc, AttributeValue::Addr(a)) => self.high = Some(a),
            (gimli::DW_AT_high_pc, AttributeValue::DebugAddrIndex(i)) => {
                self.high = unit.address(i).ok()
            }
            (gimli::DW_AT_high_pc, AttributeValue::Udata(s)) => self.size = Some(s),
            (gimli::DW_AT_ranges, value) => {
                self.ranges = unit.attr_ranges_offset(value).ok().flatten()
            }
            _ => {}
        }
    }

    /// Calls `f` with every non-empty range; false if there was none.
    fn for_each(&self, unit: UnitRef<'_, '_>, mut f: impl FnMut(u64, u64)) -> bool {
        let mut any = false;
        let mut add = |b: u64, e: u64| {
            if b < e {
                f(b, e);
                any = true;
            }
        };
        if let Some(offset) = self.ranges {
            if let Ok(mut list) = unit.ranges(offset) {
                while let Ok(Some(r)) = list.next() {
                    add(r.begin, r.end);
                }
            }
        } else if let (Some(b), Some(e)) = (self.low, self.high) {
            add(b, e);
        } else if let (Some(b), Some(s)) = (self.low, self.size) {
            // A -1 tombstone overflows and is dropped as empty.
            add(b, b.wrapping_add(s));
        }
        any
    }
}

/// The name attributes of an entry, in the order that decides between them.
#[derive(Default)]
struct NameAttrs<'a> {
    linkage: Option<AttributeValue<Slice<'a>>>,
    /// `DW_AT_name` and `DW_AT_abstract_origin`/`DW_AT_specification`, as they come: the
    /// first that yields a name wins.
    others: [Option<AttributeValue<Slice<'a>>>; 2],
    others_len: usize,
}

impl<'a> NameAttrs<'a> {
    fn add(&mut self, attr: &gimli::Attribute<Slice<'a>>) {
        match attr.name() {
            gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                self.linkage = Some(attr.value())
            }
            gimli::DW_AT_name | gimli::DW_AT_abstract_origin | gimli::DW_AT_specification => {
                if let Some(slot) = self.others.get_mut(self.others_len) {
                    *slot = Some(attr.value());
                    self.others_len += 1;
                }
            }
            _ => {}
        }
    }
}

/// The entries of other units that names refer to, parsed for one pass.
pub(super) struct Pass<'d, 'a> {
    dwarf: &'d Dwarf<'a>,
    index: &'d UnitIndex,
    /// Units entered for a reference, by position in `index.units`; cleared when it grows.
    referred: HashMap<usize, Rc<Unit<'a>>>,
    /// Told about how many bytes of the file each unit read takes.
    touch: &'d dyn Fn(u64),
    split: Option<SplitSource<'a>>,
    /// The DWARF package, read on the first skeleton unit; `Some(None)`: there is none.
    package: Option<Option<gimli::DwarfPackage<Slice<'a>>>>,
}

/// A frame's file and line.
type Location = (Option<Arc<str>>, Option<u32>);

/// What one unit says about an address.
#[derive(Default)]
struct Answer<'a> {
    function: Option<FunctionMatch<'a>>,
    row: Option<(u64, u32)>,
}

struct FunctionMatch<'a> {
    name: Option<Slice<'a>>,
    /// Outermost first.
    inlined: Vec<Inlined<'a>>,
}

struct Inlined<'a> {
    name: Option<Slice<'a>>,
    call_file: Option<u64>,
    call_line: u32,
}

/// The frames of one address: `frames` (innermost first) as the debug info names them,
/// and the location alone when no frame has a name (for the symbol-table fallback).
#[derive(Default, Clone)]
pub(super) struct Found {
    pub(super) frames: Vec<FrameLine>,
    pub(super) location: Option<(Option<Arc<str>>, Option<u32>)>,
    /// The out-of-line function (the last frame) has a bare Rust name (see
    /// `qualify`): the symbol table should name it.
    pub(super) bare_function: bool,
    /// Frames (by index) that are closures written in the out-of-line function, with
    /// their own name: once the symbol table names that function, they read
    /// `<its path>::<name>` (see `qualify::Named::InFunction`).
    pub(super) closures_in_function: Vec<(usize, String)>,
    /// Frames (by index) named by a path within the unit's crate, which the unit's name
    /// does not give (`qualify::Named::InUnitCrate`).
    pub(super) in_unit_crate: Vec<usize>,
    /// The crate of the compile unit, from its name (Rust units).
    pub(super) unit_crate: Option<Arc<str>>,
}

impl<'d, 'a> Pass<'d, 'a> {
    pub(super) fn new(
        dwarf: &'d Dwarf<'a>,
        index: &'d UnitIndex,
        touch: &'d dyn Fn(u64),
        split: Option<SplitSource<'a>>,
    ) -> Pass<'d, 'a> {
        Pass {
            dwarf,
            index,
            referred: HashMap::new(),
            touch,
            split,
            package: None,
        }
    }

    /// The frames of each of `probes` (sorted, distinct file addresses). `intern` shares
    /// the strings of equal names and paths.
    pub(super) fn resolve(
        &mut self,
        probes: &[u64],
        intern: &mut dyn FnMut(&str) -> Arc<str>,
    ) -> Vec<Found> {
        let mut found = vec![Found::default(); probes.len()];
        // The k-th covering unit each probe is tried in next: as addr2line does, an address
        // goes to the next unit only if this one has neither a function nor a row for it.
        let mut tries = vec![0usize; probes.len()];
        let mut pending: Vec<usize> = (0..probes.len()).collect();
        let mut groups: Vec<(u32, usize)> = Vec::new();
        while !pending.is_empty() {
            groups.clear();
            for &p in &pending {
                if let Some(unit) = self.index.candidate(probes[p], tries[p]) {
                    groups.push((unit, p));
                }
            }
            pending.clear();
            groups.sort_unstable();
            for group in groups.chunk_by(|a, b| a.0 == b.0) {
                let unit = group[0].0 as usize;
                let members: Vec<usize> = group.iter().map(|g| g.1).collect();
                let addresses: Vec<u64> = members.iter().map(|&p| probes[p]).collect();
                let Some(answers) = self.unit(unit, &addresses, &members, &mut found, intern)
                else {
                    // An unreadable unit: these addresses fall back to the symbol table.
                    continue;
                };
                for (&p, answered) in members.iter().zip(answers) {
                    if !answered {
                        tries[p] += 1;
                        pending.push(p);
                    }
                }
            }
        }
        found
    }

    /// Resolves `addresses` (sorted) in unit `unit` into `found[members[i]]`; says for each
    /// whether the unit had a function or a row for it.
    fn unit(
        &mut self,
        unit: usize,
        addresses: &[u64],
        members: &[usize],
        found: &mut [Found],
        intern: &mut dyn FnMut(&str) -> Arc<str>,
    ) -> Option<Vec<bool>> {
        let entry = self.index.units.get(unit)?;
        let mut lang = entry.lang;
        let header = self
            .dwarf
            .debug_info
            .header_from_offset(gimli::DebugInfoOffset(entry.offset))
            .ok()?;
        // Its entries, and a line program of about the same size.
        (self.touch)(2 * header.length_including_self() as u64 + PAGES_PER_UNIT);
        let parsed = self.dwarf.unit(header).ok()?;
        // A skeleton unit keeps its ranges and line program here; its entries (functions,
        // inlined calls, language, name) are in the split unit. Without that file, the
        // symbol table names its addresses.
        let split = match parsed.dwo_id {
            Some(id) => self.split_unit(&parsed, id),
            None => None,
        };
        let unit_ref = gimli::UnitRef::new(self.dwarf, &parsed);
        let entries_ref = match &split {
            Some((dwarf, unit)) => {
                lang = lang.or_else(|| root_language(gimli::UnitRef::new(dwarf, unit)));
                gimli::UnitRef::new(dwarf, unit)
            }
            None => unit_ref,
        };
        let rust = lang == Some(gimli::DW_LANG_Rust);
        let unit_crate: Option<Arc<str>> = entries_ref
            .name
            .filter(|_| rust)
            .and_then(|n| super::qualify::crate_of_unit(&n.to_string_lossy()).map(&mut *intern));
        let mut answers: Vec<Answer<'a>> =
            (0..addresses.len()).map(|_| Answer::default()).collect();
        self.functions(entries_ref, addresses, &mut answers);
        // Line information (rows, and the files inlined calls name) is the skeleton's.
        rows(unit_ref, addresses, &mut answers);

        let mut files: HashMap<u64, Option<Arc<str>>> = HashMap::new();
        let mut file = |index: u64, intern: &mut dyn FnMut(&str) -> Arc<str>| {
            files
                .entry(index)
                .or_insert_with(|| file_path(unit_ref, index).map(|p| intern(&p)))
                .clone()
        };
        let mut answered = Vec::with_capacity(addresses.len());
        for (answer, &p) in answers.into_iter().zip(members) {
            answered.push(answer.function.is_some() || answer.row.is_some());
            let location = answer
                .row
                .map(|(f, line)| (file(f, intern), (line != 0).then_some(line)));
            let Some(function) = answer.function else {
                found[p].location = location;
                continue;
            };
            // The chain as debug info names it, innermost first, then its names.
            let mut raw: Vec<(String, Option<Location>, bool)> =
                Vec::with_capacity(function.inlined.len() + 1);
            let mut at = location.clone();
            let demangled =
                |name: Slice<'a>| super::demangle(&name.to_string_lossy(), lang).into_owned();
            for inlined in function.inlined.iter().rev() {
                if let Some(name) = inlined.name {
                    raw.push((demangled(name), at.clone(), true));
                }
                let call_file = match (inlined.call_file, &unit_ref.line_program) {
                    (Some(f), Some(_)) => file(f, intern),
                    _ => None,
                };
                at = Some((
                    call_file,
                    (inlined.call_line != 0).then_some(inlined.call_line),
                ));
            }
            if let Some(name) = function.name {
                raw.push((demangled(name), at, false));
            }
            let named = if rust {
                let chain: Vec<super::qualify::RawFrame<'_>> = raw
                    .iter()
                    .map(|(name, at, inlined)| super::qualify::RawFrame {
                        name,
                        file: at.as_ref().and_then(|(f, _)| f.as_deref()),
                        inlined: *inlined,
                    })
                    .collect();
                super::qualify::chain(&chain, unit_crate.as_deref())
            } else {
                Vec::new()
            };
            let mut closures_in_function = Vec::new();
            let mut in_unit_crate = Vec::new();
            let mut frames = Vec::with_capacity(raw.len());
            for (i, (name, at, _)) in raw.iter().enumerate() {
                let (file, line) = at.clone().unwrap_or((None, None));
                let name = match named.get(i) {
                    Some(super::qualify::Named::As(qualified)) => qualified.as_str(),
                    Some(super::qualify::Named::InFunction { suffix, fallback }) => {
                        closures_in_function.push((i, suffix.clone()));
                        fallback.as_str()
                    }
                    Some(super::qualify::Named::InUnitCrate(path)) => {
                        in_unit_crate.push(i);
                        path.as_str()
                    }
                    _ => name.as_str(),
                };
                frames.push(FrameLine {
                    function: intern(name),
                    file,
                    line,
                });
            }
            let bare_function = rust
                && function.name.is_some()
                && frames
                    .last()
                    .is_some_and(|f| super::qualify::is_bare(&f.function));
            found[p] = Found {
                frames,
                location,
                bare_function,
                closures_in_function: if bare_function {
                    closures_in_function
                } else {
                    Vec::new()
                },
                in_unit_crate: if bare_function {
                    in_unit_crate
                } else {
                    Vec::new()
                },
                unit_crate: unit_crate.clone(),
            };
        }
        Some(answered)
    }

    /// The split unit of skeleton `skeleton` (`id` its DWO id), from the DWARF package,
    /// else from the `.dwo` file it names; `None` if neither has it.
    fn split_unit(
        &mut self,
        skeleton: &Unit<'a>,
        id: gimli::DwoId,
    ) -> Option<(Dwarf<'a>, Unit<'a>)> {
        let source = self.split.as_ref()?;
        let parent = self.dwarf;
        let package = self.package.get_or_insert_with(|| {
            let bytes = source.files.bytes(&source.package)?;
            let object = object::File::parse(bytes).ok()?;
            let empty = gimli::EndianSlice::new(
                &[][..],
                gimli::Reader::endian(gimli::Section::reader(&parent.debug_info)),
            );
            gimli::DwarfPackage::load(sections(&object, true), empty).ok()
        });
        let (dwarf, path) = match package
            .as_ref()
            .and_then(|p| p.find_cu(id, parent).ok().flatten())
        {
            Some(dwarf) => (dwarf, source.package.clone()),
            None => {
                let name = skeleton.dwo_name().ok()??;
                let name = parent.attr_string(skeleton, name).ok()?;
                // A relative name is relative to the unit's directory; an absolute one
                // replaces it (what `PathBuf::push` does).
                let mut path = skeleton
                    .comp_dir
                    .map(|d| std::path::PathBuf::from(d.to_string_lossy().as_ref()))
                    .unwrap_or_default();
                path.push(name.to_string_lossy().as_ref());
                let object = object::File::parse(source.files.bytes(&path)?).ok()?;
                let mut dwarf = gimli::Dwarf::load(sections(&object, true)).ok()?;
                dwarf.make_dwo(parent);
                (dwarf, path)
            }
        };
        let header = dwarf.units().next().ok()??;
        source.files.touch(
            &path,
            2 * header.length_including_self() as u64 + PAGES_PER_UNIT,
        );
        let mut unit = dwarf.unit(header).ok()?;
        // A stale `.dwo` or package (rebuilt binary) has other ids: its names are not ours.
        if unit.dwo_id != Some(id) {
            return None;
        }
        unit.copy_relocated_attributes(skeleton);
        Some((dwarf, unit))
    }

    /// One walk over the unit's entries: for each address, the subprogram covering it and
    /// the chain of inlined subroutines in it covering it.
    fn functions(&mut self, unit: UnitRef<'_, 'a>, addresses: &[u64], answers: &mut [Answer<'a>]) {
        /// An open entry whose children come next.
        enum Open {
            /// A subprogram, with the addresses it was chosen for.
            Function(Vec<usize>),
            /// An inlined subroutine at this inlining depth within its subprogram.
            Inlined,
        }
        let Ok(mut entries) = unit.entries_raw(None) else {
            return;
        };
        let mut open: Vec<(isize, Open)> = Vec::new();
        let mut scratch = Vec::new();
        // Addresses without a subprogram yet, and open subprograms that some address took:
        // once both are zero nothing later can change an answer.
        let mut unmatched = addresses.len();
        let mut open_chosen = 0usize;
        while !entries.is_empty() {
            let depth = entries.next_depth();
            let Ok(abbrev) = entries.read_abbreviation() else {
                return;
            };
            let Some(abbrev) = abbrev else { continue };
            while open.last().is_some_and(|(d, _)| *d >= depth) {
                if let Some((_, Open::Function(chosen))) = open.pop() {
                    open_chosen -= usize::from(!chosen.is_empty());
                }
            }
            if unmatched == 0 && open_chosen == 0 {
                return;
            }
            let tag = abbrev.tag();
            if tag != gimli::DW_TAG_subprogram && tag != gimli::DW_TAG_inlined_subroutine {
                if entries.skip_attributes(abbrev.attributes()).is_err() {
                    return;
                }
                continue;
            }
            // For an inlined subroutine: its depth counts the inlined ones open since the
            // nearest subprogram (lexical blocks in between do not count), and that
            // subprogram says which addresses it may cover.
            let mut level = 0;
            let mut function = None;
            if tag == gimli::DW_TAG_inlined_subroutine {
                for (at, (_, o)) in open.iter().enumerate().rev() {
                    match o {
                        Open::Inlined => level += 1,
                        Open::Function(chosen) => {
                            function = (!chosen.is_empty()).then_some(at);
                            break;
                        }
                    }
                }
                if function.is_none() {
                    // Most entries: inlined code of functions no address is in.
                    if entries.skip_attributes(abbrev.attributes()).is_err() {
                        return;
                    }
                    open.push((depth, Open::Inlined));
                    continue;
                }
            }
            let mut ranges = Ranges::default();
            let mut names = NameAttrs::default();
            let mut call_file = None;
            let mut call_line = 0;
            for spec in abbrev.attributes() {
                let Ok(attr) = entries.read_attribute(*spec) else {
                    return;
                };
                match attr.name() {
                    gimli::DW_AT_call_file => {
                        // DWARF 5 numbers files from 0; before, 0 meant none.
                        if let AttributeValue::FileIndex(f) = attr.value() {
                            if f > 0 || unit.header.version() >= 5 {
                                call_file = Some(f);
                            }
                        }
                    }
                    gimli::DW_AT_call_line => {
                        call_line = attr.udata_value().unwrap_or(0) as u32;
                    }
                    _ => {
                        ranges.add(unit, &attr);
                        names.add(&attr);
                    }
                }
            }
            if tag == gimli::DW_TAG_subprogram {
                // Each address takes the first subprogram covering it.
                scratch.clear();
                ranges.for_each(unit, |b, e| {
                    let from = addresses.partition_point(|&a| a < b);
                    let to = addresses.partition_point(|&a| a < e);
                    scratch.extend(from..to);
                });
                scratch.retain(|&i| answers[i].function.is_none());
                scratch.sort_unstable();
                scratch.dedup();
                if !scratch.is_empty() {
                    let name = self.name(unit, &names);
                    for &i in &scratch {
                        answers[i].function = Some(FunctionMatch {
                            name,
                            inlined: Vec::new(),
                        });
                    }
                }
                unmatched -= scratch.len();
                open_chosen += usize::from(!scratch.is_empty());
                open.push((depth, Open::Function(scratch.clone())));
                continue;
            }
            let chosen: &[usize] = match function.and_then(|at| open.get(at)) {
                Some((_, Open::Function(chosen))) => chosen,
                _ => &[],
            };
            if !chosen.is_empty() {
                let mut hits = Vec::new();
                ranges.for_each(unit, |b, e| {
                    hits.extend(chosen.iter().copied().filter(|&i| {
                        (b..e).contains(&addresses[i])
                            && answers[i]
                                .function
                                .as_ref()
                                .is_some_and(|f| f.inlined.len() == level)
                    }));
                });
                hits.sort_unstable();
                hits.dedup();
                if !hits.is_empty() {
                    let name = self.name(unit, &names);
                    for i in hits {
                        if let Some(f) = answers[i].function.as_mut() {
                            f.inlined.push(Inlined {
                                name,
                                call_file,
                                call_line,
                            });
                        }
                    }
                }
            }
            open.push((depth, Open::Inlined));
        }
    }

    /// The name an entry's attributes give, following references up to 16 entries deep.
    fn name(&mut self, unit: UnitRef<'_, 'a>, names: &NameAttrs<'a>) -> Option<Slice<'a>> {
        if let Some(Ok(name)) = names.linkage.map(|v| unit.attr_string(v)) {
            return Some(name);
        }
        for value in names.others[..names.others_len].iter().flatten() {
            let name = match value {
                AttributeValue::UnitRef(_) | AttributeValue::DebugInfoRef(_) => {
                    self.follow(unit, *value, 16)
                }
                v => unit.attr_string(*v).ok(),
            };
            if name.is_some() {
                return name;
            }
        }
        None
    }

    /// The name of the entry `reference` points to (in this unit or another).
    fn follow(
        &mut self,
        unit: UnitRef<'_, 'a>,
        reference: AttributeValue<Slice<'a>>,
        limit: usize,
    ) -> Option<Slice<'a>> {
        if limit == 0 {
            return None;
        }
        match reference {
            AttributeValue::UnitRef(offset) => self.entry_name(unit, offset, limit),
            // A split unit's references stay within it; `index` is the binary's.
            AttributeValue::DebugInfoRef(_) if !std::ptr::eq(unit.dwarf, self.dwarf) => None,
            AttributeValue::DebugInfoRef(target) => {
                let position = self.index.units.partition_point(|u| u.offset <= target.0);
                let entry = self.index.unit_at(target.0)?;
                let other = match self.referred.get(&position) {
                    Some(u) => u.clone(),
                    None => {
                        if self.referred.len() >= 64 {
                            self.referred.clear();
                        }
                        let header = self
                            .dwarf
                            .debug_info
                            .header_from_offset(gimli::DebugInfoOffset(entry.offset))
                            .ok()?;
                        (self.touch)(PAGES_PER_UNIT);
                        let u = Rc::new(self.dwarf.unit(header).ok()?);
                        self.referred.insert(position, u.clone());
                        u
                    }
                };
                let offset = target.to_unit_offset(&other.header)?;
                self.entry_name(gimli::UnitRef::new(self.dwarf, &other), offset, limit)
            }
            _ => None,
        }
    }

    fn entry_name(
        &mut self,
        unit: UnitRef<'_, 'a>,
        offset: gimli::UnitOffset<usize>,
        limit: usize,
    ) -> Option<Slice<'a>> {
        let mut entries = unit.entries_raw(Some(offset)).ok()?;
        let abbrev = entries.read_abbreviation().ok()??;
        let mut name = None;
        let mut next = None;
        for spec in abbrev.attributes() {
            let attr = entries.read_attribute(*spec).ok()?;
            match attr.name() {
                gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                    if let Ok(s) = unit.attr_string(attr.value()) {
                        return Some(s);
                    }
                }
                gimli::DW_AT_name => {
                    if let Ok(s) = unit.attr_string(attr.value()) {
                        name = Some(s);
                    }
                }
                gimli::DW_AT_abstract_origin | gimli::DW_AT_specification => {
                    next = Some(attr.value())
                }
                _ => {}
            }
        }
        if name.is_some() {
            return name;
        }
        self.follow(unit, next?, limit - 1)
    }
}

/// One run of the unit's line program: for each address, the file index and line of the
/// last row at the highest address at or below it, within a sequence covering it.
fn rows(unit: UnitRef<'_, '_>, addresses: &[u64], answers: &mut [Answer<'_>]) {
    let Some(program) = unit.line_program.clone() else {
        return;
    };
    let mut rows = program.rows();
    // The current sequence: its first address, the row waiting for the next address,
    // and the answers it would give (kept only if the sequence is not empty).
    let mut start: Option<u64> = None;
    let mut last: Option<(u64, u64, u32)> = None;
    let mut tentative: Vec<(usize, u64, u32)> = Vec::new();
    // Addresses without a row: the program is read no further once it is zero.
    let mut missing = addresses.len();
    let assign = |from: u64, to: u64, file: u64, line: u32, tentative: &mut Vec<_>| {
        let first = addresses.partition_point(|&a| a < from);
        for (i, &a) in addresses.iter().enumerate().skip(first) {
            if a >= to {
                break;
            }
            tentative.push((i, file, line));
        }
    };
    while let Ok(Some((_, row))) = rows.next_row() {
        let address = row.address();
        if row.end_sequence() {
            if let (Some(s), Some((a, file, line))) = (start, last) {
                assign(a, address, file, line, &mut tentative);
                if s < address {
                    for &(i, file, line) in &tentative {
                        if answers[i].row.is_none() {
                            answers[i].row = Some((file, line));
                            missing -= 1;
                        }
                    }
                }
            }
            if missing == 0 {
                return;
            }
            start = None;
            last = None;
            tentative.clear();
            continue;
        }
        let line = row.line().map_or(0, |l| l.get() as u32);
        match last {
            // Rows at one address: the last one stands.
            Some((a, _, _)) if a == address => {}
            Some((a, file, l)) => assign(a, address, file, l, &mut tentative),
            None => start = Some(address),
        }
        last = Some((address, row.file_index(), line));
    }
}

/// The path of file `index` of the unit's line program, as addr2line renders it.
fn file_path(unit: UnitRef<'_, '_>, index: u64) -> Option<String> {
    let header = unit.line_program.as_ref()?.header();
    let Some(file) = header.file(index) else {
        // DWARF 4 has no file 0; addr2line names it "".
        return (index == 0).then(String::new);
    };
    let mut path = match unit.comp_dir {
        Some(dir) => dir.to_string_lossy().into_owned(),
        None => String::new(),
    };
    if file.directory_index() != 0 {
        if let Some(dir) = file.directory(header) {
            push_path(&mut path, &unit.attr_string(dir).ok()?.to_string_lossy());
        }
    }
    push_path(
        &mut path,
        &unit.attr_string(file.path_name()).ok()?.to_string_lossy(),
    );
    Some(path)
}

/// Appends `part` to `path`; an absolute `part` (Unix or Windows) replaces it.
fn push_path(path: &mut String, part: &str) {
    let unix_root = |p: &str| p.starts_with('/') || p.get(1..3) == Some(":/");
    let windows_root = |p: &str| p.starts_with('\\') || p.get(1..3) == Some(":\\");
    if unix_root(part) || windows_root(part) {
        *path = part.to_string();
        return;
    }
    let separator = if windows_root(path) { '\\' } else { '/' };
    if !path.is_empty() && !path.ends_with(separator) {
        path.push(separator);
    }
    path.push_str(part);
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::{demangle, mapped::Mapped, FileKey, FileNames, MAX_NAMED_ADDRESSES};
    use super::*;

    /// What the symbolizer named an address before this module: `addr2line`'s frames
    /// (unnamed ones skipped), else its symbol and location, else the file and address.
    pub(super) fn reference(
        loader: &addr2line::Loader,
        path: &Path,
        address: u64,
    ) -> Vec<FrameLine> {
        let mut lines = Vec::new();
        if let Ok(mut frames) = loader.find_frames(address) {
            while let Ok(Some(frame)) = frames.next() {
                let Some(function) = frame.function.as_ref().and_then(|f| f.demangle().ok()) else {
                    continue;
                };
                let (file, line) = frame
                    .location
                    .map(|l| (l.file.map(Arc::<str>::from), l.line))
                    .unwrap_or((None, None));
                lines.push(FrameLine {
                    function: Arc::from(function.as_ref()),
                    file,
                    line,
                });
            }
        }
        if lines.is_empty() {
            if let Some(symbol) = loader.find_symbol(address) {
                let location = loader.find_location(address).ok().flatten();
                lines.push(FrameLine {
                    function: Arc::from(addr2line::demangle_auto(symbol.into(), None).as_ref()),
                    file: location.as_ref().and_then(|l| l.file).map(Arc::from),
                    line: location.and_then(|l| l.line),
                });
            }
        }
        if lines.is_empty() {
            lines.push(super::super::unknown(path, address));
        }
        lines
    }

    /// For the differential test: the names of the sized function symbols of `exe` that
    /// cover an address, when more than one does (overlapping, not nested, functions).
    fn overlapping_functions(exe: &Path) -> impl Fn(u64) -> Vec<&'static str> {
        use object::{Object, ObjectSymbol, SymbolKind};
        let data: &'static [u8] = Box::leak(std::fs::read(exe).expect("read").into_boxed_slice());
        let file = object::File::parse(data).expect("parse");
        let mut functions: Vec<(u64, u64, &'static str)> = file
            .symbols()
            .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
            .filter_map(|s| Some((s.address(), s.address() + s.size(), s.name().ok()?)))
            .collect();
        functions.sort_unstable();
        move |address| {
            let end = functions.partition_point(|f| f.0 <= address);
            functions[..end]
                .iter()
                .filter(|f| address < f.1)
                .map(|f| f.2)
                .collect()
        }
    }

    #[inline(always)]
    fn inlined_inner(out: &mut Vec<u64>) {
        let trace = backtrace::Backtrace::new_unresolved();
        out.extend(trace.frames().iter().map(|f| f.ip() as usize as u64));
    }

    #[inline(always)]
    fn inlined_outer(out: &mut Vec<u64>) {
        inlined_inner(out);
        std::hint::black_box(&out);
    }

    #[inline(never)]
    fn through_inlined_code() -> Vec<u64> {
        let mut out = Vec::new();
        inlined_outer(&mut out);
        out
    }

    /// Every `step`-th function of the test binary: its first byte, a byte inside, its
    /// last byte; and the return addresses of a backtrace taken through inlined code.
    fn addresses_of_this_binary(step: usize) -> (std::path::PathBuf, Vec<u64>) {
        use object::{Object, ObjectSymbol, SymbolKind};
        let exe = std::env::current_exe().expect("test binary");
        let data = std::fs::read(&exe).expect("read the test binary");
        let file = object::File::parse(&*data).expect("parse the test binary");
        let mut addresses = Vec::new();
        let functions = file
            .symbols()
            .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0 && s.address() > 0);
        for s in functions.step_by(step) {
            addresses.extend([
                s.address(),
                s.address() + s.size() / 2,
                s.address() + s.size() - 1,
            ]);
        }
        // Runtime return addresses to file addresses: the executable's load bias.
        let function = through_inlined_code as fn() -> Vec<u64> as usize as u64;
        let exe_map = crate::sampler::modules::list()
            .objects
            .iter()
            .find(|o| o.code.contains(&function))
            .map(|o| o.bias)
            .expect("the test binary is listed");
        for ip in through_inlined_code() {
            addresses.push(ip.wrapping_sub(exe_map).wrapping_sub(1));
        }
        (exe, addresses)
    }

    /// The differential test: the same frames (function, file, line, whole inline chain)
    /// as `addr2line::Loader`, for thousands of addresses of this binary (full debug info).
    #[test]
    fn names_like_addr2line() {
        let (exe, addresses) = addresses_of_this_binary(7);
        let loader = addr2line::Loader::new(&exe).expect("addr2line loads the test binary");
        let mut file = FileNames::default();
        let key = FileKey::at(&exe);
        let overlapping = overlapping_functions(&exe);
        let (mut inlined, mut with_lines, mut differ, mut ambiguous) = (0, 0, Vec::new(), 0);
        let (mut line_tables_only, mut exact_inlined) = (0, 0);
        let same_place = |a: &FrameLine, b: &FrameLine| (&a.file, a.line) == (&b.file, b.line);
        for (i, &address) in addresses.iter().enumerate() {
            if i % MAX_NAMED_ADDRESSES == 0 {
                // One pass names at most the cap: the addresses go in passes that size.
                let end = (i + MAX_NAMED_ADDRESSES).min(addresses.len());
                file.name_all(&key, addresses[i..end].to_vec());
            }
            let expected = reference(&loader, &exe, address);
            let got = file.names.get(&address).expect("every address is named");
            inlined += usize::from(expected.len() > 1);
            with_lines += usize::from(expected.iter().any(|l| l.line.is_some()));
            if **got == *expected {
                exact_inlined += usize::from(expected.len() > 1);
                continue;
            }
            // A unit with line tables only (the dependencies of test builds, see the root
            // Cargo.toml): DWARF has bare names, which ours qualify (`qualify`, checked by
            // `names_carry_their_paths_under_every_debug_setting`); the chain, files and
            // lines must still be addr2line's.
            if expected
                .iter()
                .any(|l| crate::collector::symbolize::qualify::is_bare(&l.function))
                && got.len() == expected.len()
                && got
                    .iter()
                    .zip(expected.iter())
                    .all(|(a, b)| same_place(a, b))
            {
                line_tables_only += 1;
                continue;
            }
            // Functions whose ranges overlap without nesting (assembly that declares a
            // local routine inside a global one, each `.type @function` with a size):
            // which one an address takes is unspecified (addr2line binary-searches the
            // overlapping ranges). Either name is right there; file and line still agree.
            let covering = overlapping(address);
            if let ([ours], [theirs]) = (&got[..], &expected[..]) {
                if covering.len() > 1
                    && covering.contains(&&*ours.function)
                    && covering.contains(&&*theirs.function)
                    && same_place(ours, theirs)
                {
                    ambiguous += 1;
                    continue;
                }
            }
            differ.push((address, expected, got.to_vec()));
        }
        assert!(
            ambiguous * 1000 < addresses.len(),
            "{ambiguous} addresses in overlapping functions: too many to be assembly"
        );
        let summary: Vec<String> = differ
            .iter()
            .map(|(address, expected, got)| {
                let names = |frames: &[FrameLine]| {
                    frames
                        .iter()
                        .map(|f| format!("{} ({:?}:{:?})", f.function, f.file, f.line))
                        .collect::<Vec<_>>()
                        .join(" <- ")
                };
                format!(
                    "{address:#x}: addr2line {} | ours {}",
                    names(expected),
                    names(got)
                )
            })
            .collect();
        assert!(
            differ.is_empty(),
            "{} of {} addresses differ:\n{}",
            differ.len(),
            addresses.len(),
            summary.join("\n")
        );
        // Not vacuous: inline chains and lines were compared.
        assert!(inlined > 100, "{inlined} addresses with an inline chain");
        // Full debug info (the workspace's crates) still compared name for name.
        assert!(
            exact_inlined > 100,
            "{exact_inlined} inline chains equal to addr2line's, name for name \
             ({line_tables_only} of line-tables-only units compared by place)"
        );
        assert!(with_lines > addresses.len() / 2, "{with_lines} with lines");
        eprintln!(
            "{} addresses: {exact_inlined} inline chains name for name, {line_tables_only} \
             of line-tables-only units by place",
            addresses.len()
        );
    }

    /// The backtrace taken through `#[inline(always)]` code names both inlined functions,
    /// innermost first, with the line of each call.
    #[test]
    fn names_the_inline_chain_of_a_return_address() {
        let (exe, addresses) = addresses_of_this_binary(usize::MAX);
        let mut file = FileNames::default();
        file.name_all(&FileKey::at(&exe), addresses.clone());
        let chain = addresses
            .iter()
            .filter_map(|a| file.names.get(a))
            .find(|lines| lines.iter().any(|l| l.function.ends_with("inlined_inner")))
            .expect("a frame in inlined_inner");
        let names: Vec<&str> = chain.iter().map(|l| &*l.function).collect();
        let at = |suffix: &str| names.iter().position(|n| n.ends_with(suffix));
        let (inner, outer, caller) = (
            at("inlined_inner"),
            at("inlined_outer"),
            at("through_inlined_code"),
        );
        assert!(
            inner < outer && outer < caller && caller.is_some(),
            "innermost first: {names:?}"
        );
        assert!(chain.iter().all(|l| l.line.is_some()), "{chain:?}");
    }

    /// Corrupt debug info degrades to symbol-table names or hex, never a panic.
    #[test]
    fn corrupt_debug_info_does_not_panic() {
        use object::{Object, ObjectSection};
        let (exe, addresses) = addresses_of_this_binary(53);
        let mut data = std::fs::read(&exe).expect("read the test binary");
        let ranges: Vec<(usize, usize)> = {
            let file = object::File::parse(&*data).expect("parse");
            [
                ".debug_info",
                ".debug_line",
                ".debug_abbrev",
                ".debug_str",
                ".debug_ranges",
            ]
            .iter()
            .filter_map(|name| file.section_by_name(name)?.file_range())
            .map(|(start, size)| (start as usize, size as usize))
            .collect()
        };
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for (start, size) in ranges {
            // Every 97th byte scrambled, and a run of 0xff in the middle.
            for i in (start..start + size).step_by(97) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                data[i] = seed as u8;
            }
            let mid = start + size / 2;
            data[mid..(mid + 4096).min(start + size)].fill(0xff);
        }
        let dir = std::env::temp_dir().join(format!("otel-profiling-dwarf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("corrupt");
        std::fs::write(&path, &data).expect("write");
        let mut file = FileNames::default();
        file.name_all(&FileKey::at(path), addresses.clone());
        let _ = std::fs::remove_dir_all(&dir);
        for address in addresses {
            let lines = file.names.get(&address).expect("named");
            assert!(!lines.is_empty() && !lines[0].function.is_empty());
        }
    }

    /// What the index keeps for this binary, and the demangling it shares with the
    /// symbol-table path.
    #[test]
    fn the_index_is_small() {
        let exe = std::env::current_exe().expect("test binary");
        let mapped = Mapped::open(&exe).expect("map");
        let object = object::File::parse(mapped.bytes()).expect("parse");
        let dwarf = load(&object).expect("dev builds have debug info");
        let index = UnitIndex::build(&dwarf, &|b| mapped.touch(b));
        let symbols = super::super::SymbolTable::parse(&object, mapped.bytes());
        eprintln!(
            "index: {} ranges, {} units, {} bytes; symbols: {} bytes",
            index.ranges.len(),
            index.units.len(),
            index.heap_bytes(),
            symbols.heap_bytes()
        );
        assert!(index.heap_bytes() < 64 * index.units.len() + 32 * index.ranges.len());
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE", None),
            "core::fmt::write"
        );
    }
}

#[cfg(test)]
mod measure {
    use super::super::mapped::{Mapped, SymbolTable};
    use super::super::FileKey;
    use super::*;

    /// What the index and symbol table keep for the file at `$SYMBOLIZE_INDEX_FILE` (the
    /// figures in docs/benchmarks.md), and the same frames as `addr2line` for its
    /// functions: `cargo test -p otel-profiling --lib index_size_of_a_file -- --ignored
    /// --nocapture`.
    #[test]
    #[ignore = "a measurement of a file named by $SYMBOLIZE_INDEX_FILE"]
    fn index_size_of_a_file() {
        let Some(path) = std::env::var_os("SYMBOLIZE_INDEX_FILE") else {
            return;
        };
        let mapped = Mapped::open(std::path::Path::new(&path)).expect("map");
        let object = object::File::parse(mapped.bytes()).expect("parse");
        let index = load(&object)
            .map(|dwarf| UnitIndex::build(&dwarf, &|b| mapped.touch(b)))
            .unwrap_or_default();
        let symbols = SymbolTable::parse(&object, mapped.bytes());
        eprintln!(
            "{}: {} units, {} ranges, index {} KiB; symbol table {} KiB",
            path.to_string_lossy(),
            index.units.len(),
            index.ranges.len(),
            index.heap_bytes() / 1024,
            symbols.heap_bytes() / 1024
        );
        // The differential check on that file too (a release build with line tables is
        // what services ship): every function, three addresses each.
        use object::{Object, ObjectSymbol, SymbolKind};
        let path = std::path::Path::new(&path);
        let mut addresses = Vec::new();
        for s in object
            .symbols()
            .chain(object.dynamic_symbols())
            .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0 && s.address() > 0)
        {
            addresses.extend([
                s.address(),
                s.address() + s.size() / 2,
                s.address() + s.size() - 1,
            ]);
        }
        let loader = addr2line::Loader::new(path).expect("addr2line loads the file");
        let mut file = super::super::FileNames::default();
        file.name_all(&FileKey::at(path), addresses.clone());
        let (mut differ, mut inlined) = (0, 0);
        for &address in &addresses {
            let expected = super::tests::reference(&loader, path, address);
            inlined += usize::from(expected.len() > 1);
            if file.names.get(&address).map(|l| l.to_vec()) != Some(expected.clone()) {
                if differ < 3 {
                    eprintln!(
                        "{address:#x}: {expected:?} vs {:?}",
                        file.names.get(&address)
                    );
                }
                differ += 1;
            }
        }
        eprintln!(
            "{differ} of {} addresses differ ({inlined} inlined)",
            addresses.len()
        );
        assert_eq!(differ, 0);
    }
}
