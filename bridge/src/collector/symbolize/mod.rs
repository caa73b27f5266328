//! Turning sampled addresses into function names, files and lines, off the hot path.
//!
//! Runs on the collector's encoder thread only, once per interval: [`Symbolizer::prepare`] names the
//! interval's new addresses in one pass per file (per batch of at most about 16,000
//! addresses, so that a pass never names past the cap below), then [`Symbolizer::frame`]
//! reads them from the cache. Names are demangled without the Rust hash suffix. Without debug info (a
//! default `--release` build) names come from the symbol table and carry no file or line;
//! `debug = "line-tables-only"` in the release profile adds them, with inlined frames.
//!
//! **Memory with debug info.** Nothing parsed from DWARF is kept between passes but a
//! small index per file (`dwarf::UnitIndex`: the address ranges of each compile unit, built
//! the first time the file is asked for a name, so start-up never pays for it). A pass
//! parses only the units covering new addresses (`dwarf::Pass`) and drops each when done.
//! The file stays mapped while it is loaded, but its pages are dropped from the resident
//! set every ~2 MB read (`mapped::Mapped::touch`, `MADV_DONTNEED`), so only the units read
//! last stay resident. What else stays is the symbol table of files where debug info did
//! not name an address (`mapped::SymbolTable`, 24 bytes a symbol, names left in the file)
//! and the names found, capped at [`MAX_NAMED_ADDRESSES`] per file (within a pass too;
//! `ProfilerStats::symbol_cache_entries` and `symbol_cache_clears` report them), function
//! names and paths interned. For a 52 MB binary with line tables the profiler adds about 9 MiB at the
//! peak and 6 MiB between intervals, instead of 81 MiB with `addr2line`'s whole-file
//! context (`docs/benchmarks.md`).
//!
//! **What a cached name is valid for.** A name depends on the file an address lies in and
//! on the address within that file, not on the runtime address: once an object is
//! `dlclose`d, another one (or a rebuilt copy of the same library) can be mapped at the
//! same addresses. So names are cached per file, keyed by file address (runtime address
//! minus the load bias), and a file is its path plus its identity on disk (device, inode,
//! size, modification time). [`Symbolizer::refresh`] lists the loaded objects again (with
//! the unwinder's walker, `sampler::modules`) whenever the loader's load/unload counts
//! changed. A file that stays mapped keeps its parsed debug info and names, wherever it is
//! mapped now; a file no longer mapped is dropped with them. Addresses in no object are
//! not cached, since a later `dlopen` may map them.
//!
//! **The vDSO** (`clock_gettime`, `gettimeofday`) has no file: its ELF image is copied
//! once from memory (`getauxval(AT_SYSINFO_EHDR)`, the extent `/proc/self/maps` gives it)
//! and its dynamic symbols name its addresses. Shared libraries without debug info (libc)
//! are named from their symbol tables, `.dynsym` when `.symtab` was stripped: an address
//! gets the nearest symbol at or below it that spans it; one in a function the library
//! does not export stays `libc.so.6+0x…`.
//!
//! **Limits.** Samples are named when their interval is reported, from the objects mapped
//! then: a sample taken in an object unloaded before that gets the name of whatever is
//! mapped there by then, or a hex address. The main executable is read through
//! `/proc/self/exe` (the running image, even when its path was replaced or deleted); a
//! library is read from its path only if the file there has the mapped image's build id
//! (read from the image's notes in memory): one replaced on disk while it stays loaded is
//! named by address, with one line on stderr, never with its replacement's names.

mod dwarf;
mod mapped;
mod qualify;
mod split;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::pprof::{FrameLine, SymbolizedFrame};
use crate::sampler::modules::{self, LoadGeneration, LoadedObject};
use mapped::{Mapped, SymbolTable};

/// Where the main executable is read from.
const SELF_EXE: &str = "/proc/self/exe";

/// A file's identity on disk: a library rebuilt at the same path is another file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
}

/// The file of a loaded object, as far as names go.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct FileKey {
    path: PathBuf,
    /// Where the file is read from: `/proc/self/exe` for the main executable (the image
    /// that runs, even if `path` was since replaced or deleted), `path` otherwise.
    read_from: PathBuf,
    /// `None` if the file could not be examined (deleted, say); its names then come from
    /// whatever is at `path` when they are first needed, as before this key existed.
    id: Option<FileId>,
    /// The mapped image's build id: a file read for names must carry the same one (a
    /// library replaced on disk while loaded is another file).
    build_id: Option<Arc<[u8]>>,
}

impl FileKey {
    /// The file at `path`, read from there, with no build id to check (tests).
    #[cfg(test)]
    fn at(path: impl AsRef<Path>) -> FileKey {
        ModuleMap::new(path.as_ref().to_path_buf(), 0, 0..1).file
    }
}

/// One loaded object: which file, and where it is mapped.
#[derive(Debug)]
struct ModuleMap {
    file: FileKey,
    /// Load bias: file address = runtime address − bias.
    bias: u64,
    /// Runtime addresses spanned by its executable segments.
    code: Range<u64>,
}

impl ModuleMap {
    /// `path` mapped at `bias` over `code`, identified by what is at `path` now.
    #[cfg(test)]
    fn new(path: PathBuf, bias: u64, code: Range<u64>) -> ModuleMap {
        ModuleMap::of_file(path.clone(), path, None, bias, code)
    }

    /// `path` (read from `read_from`, whose identity on disk it takes) mapped at `bias`
    /// over `code`, with the build id of the mapped image.
    fn of_file(
        path: PathBuf,
        read_from: PathBuf,
        build_id: Option<Arc<[u8]>>,
        bias: u64,
        code: Range<u64>,
    ) -> ModuleMap {
        let id = std::fs::metadata(&read_from).ok().map(|m| FileId {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
        });
        ModuleMap {
            file: FileKey {
                path,
                read_from,
                id,
                build_id,
            },
            bias,
            code,
        }
    }

    /// The mapping of a listed object; the vDSO's path is [`VDSO`].
    fn of(object: &LoadedObject) -> Option<ModuleMap> {
        let (path, read_from) = if object.name.is_empty() {
            // The loader names the main executable "". Its name is the path it was run
            // from; its bytes are those of the running image, which the kernel keeps.
            let path = std::env::current_exe().ok()?;
            (path, PathBuf::from(SELF_EXE))
        } else if object.name.starts_with("linux-vdso") || object.name.starts_with("linux-gate") {
            (PathBuf::from(VDSO), PathBuf::from(VDSO))
        } else {
            (PathBuf::from(&object.name), PathBuf::from(&object.name))
        };
        let build_id = object.build_id.as_deref().map(Arc::from);
        Some(ModuleMap::of_file(
            path,
            read_from,
            build_id,
            object.bias,
            object.code.clone(),
        ))
    }
}

/// The path standing for the vDSO, as `/proc/self/maps` names its mapping; no file has it.
const VDSO: &str = "[vdso]";

/// At most this many addresses of one file keep their names, within a pass too; past it
/// the file's names are forgotten and found again as they are sampled. An entry costs
/// about 150 bytes (key, slot, the frames' 40 bytes each) beside the interned strings, so
/// a full cache of a big binary stays around 5 MB. The encoder names an interval's
/// stacks in batches small enough for one pass to fit (`encoder::BATCH_ADDRESSES`).
pub(crate) const MAX_NAMED_ADDRESSES: usize = 32 * 1024;

/// One file's index of its debug info, built on first use, and the names found so far by
/// file address.
#[derive(Default)]
struct FileNames {
    /// `None`: not read yet; `Some(None)`: the file could not be read.
    debug: Option<Option<FileDebug>>,
    /// The vDSO's symbols, read from memory on first use; `Some(None)`: not readable.
    vdso: Option<Option<MemorySymbols>>,
    names: HashMap<u64, Arc<[FrameLine]>>,
    /// Function names and paths of `names`, each stored once.
    strings: HashSet<Arc<str>>,
    /// Times `names` was full and forgotten.
    clears: u64,
    /// Passes over the file made so far (tests: a batch is one pass, not one a frame).
    #[cfg(test)]
    passes: u64,
}

/// What is kept of a file between passes: its mapping (only the pages read last stay
/// resident), the index of its debug info and, once needed, its symbol table.
struct FileDebug {
    mapped: Mapped,
    index: dwarf::UnitIndex,
    /// Read the first time an address is not named by debug info.
    symbols: Option<SymbolTable>,
    /// The `.dwp` / `.dwo` files its skeleton units led to.
    split: split::SplitFiles,
}

impl FileDebug {
    /// Maps `file` and indexes its debug info; `None` if it cannot be read, or if it is
    /// not the image that is mapped (another build id: replaced on disk since it was
    /// loaded), whose names it would give to the mapped code.
    fn open(file: &FileKey) -> Option<FileDebug> {
        let mapped = Mapped::open(&file.read_from).ok()?;
        let object = object::File::parse(mapped.bytes()).ok()?;
        if let Some(mapped_id) = &file.build_id {
            let on_disk = object::Object::build_id(&object).ok().flatten();
            if on_disk != Some(&mapped_id[..]) {
                eprintln!(
                    "otel-profiling: {} was replaced on disk since it was loaded (its build \
                     id differs): its frames are named by address",
                    file.path.display()
                );
                return None;
            }
        }
        let index = dwarf::load(&object)
            .map(|d| dwarf::UnitIndex::build(&d, &|bytes| mapped.touch(bytes)))
            .unwrap_or_default();
        // The index read a little of every unit: none of it is needed again soon.
        mapped.release();
        Some(FileDebug {
            mapped,
            index,
            symbols: None,
            split: split::SplitFiles::default(),
        })
    }
}

/// Resolves addresses of the running process.
pub(crate) struct Symbolizer {
    /// The loaded objects, sorted by code start.
    modules: Vec<ModuleMap>,
    /// Every file in `modules` that was asked for a name, and nothing else.
    files: HashMap<FileKey, FileNames>,
    /// The loader's load/unload counts when `modules` was listed.
    listed_at: Option<LoadGeneration>,
    /// Cache clears of files no longer mapped (forgotten with them).
    clears_of_unmapped: u64,
}

impl Symbolizer {
    pub(crate) fn new() -> Symbolizer {
        let mut symbolizer = Symbolizer {
            modules: Vec::new(),
            files: HashMap::new(),
            listed_at: None,
            clears_of_unmapped: 0,
        };
        symbolizer.refresh();
        symbolizer
    }

    /// Lists the loaded objects again if one was loaded or unloaded since the last listing
    /// (otherwise this is one `dl_iterate_phdr` step). Names of files still mapped stay
    /// cached; files no longer mapped are forgotten.
    pub(crate) fn refresh(&mut self) {
        let now = modules::load_generation();
        if now.is_some() && now == self.listed_at {
            return;
        }
        let listing = modules::list();
        self.listed_at = listing.generation;
        self.remap(listing.objects.iter().filter_map(ModuleMap::of).collect());
    }

    /// Makes `modules` the loaded objects and drops the names of files not among them.
    fn remap(&mut self, mut modules: Vec<ModuleMap>) {
        modules.sort_by_key(|m| m.code.start);
        let clears = &mut self.clears_of_unmapped;
        self.files.retain(|file, names| {
            let mapped = modules.iter().any(|m| m.file == *file);
            if !mapped {
                *clears += names.clears;
            }
            mapped
        });
        self.modules = modules;
    }

    /// A symbolizer whose one object is the vDSO, mapped (made up) over `code`: every
    /// address there is named cheaply, from memory (tests of the cache's bounds).
    #[cfg(test)]
    pub(crate) fn vdso_only_over(code: Range<u64>) -> Symbolizer {
        let mut symbolizer = Symbolizer::new();
        symbolizer.remap(vec![ModuleMap {
            file: FileKey::at(VDSO),
            bias: code.start,
            code,
        }]);
        symbolizer
    }

    /// Passes made over all files kept now.
    #[cfg(test)]
    pub(crate) fn passes(&self) -> u64 {
        self.files.values().map(|f| f.passes).sum()
    }

    /// Addresses named and kept now, all files together, and the times a file's names
    /// were full and forgotten so far.
    pub(crate) fn cache_stats(&self) -> (usize, u64) {
        let named = self.files.values().map(|f| f.names.len()).sum();
        let clears = self.files.values().map(|f| f.clears).sum::<u64>();
        (named, self.clears_of_unmapped + clears)
    }

    /// Names, in one pass per file, every frame of `frames` (address, is a return
    /// address) not named yet, so that [`Symbolizer::frame`] then finds them cached. Each
    /// file is mapped once for the pass and unmapped after it.
    pub(crate) fn prepare(&mut self, frames: impl IntoIterator<Item = (u64, bool)>) {
        let mut wanted: HashMap<usize, Vec<u64>> = HashMap::new();
        for (address, return_address) in frames {
            let probe = probe(address, return_address);
            let Some(i) = module_index(&self.modules, probe) else {
                continue;
            };
            // Cached ones too: a pass that must forget names keeps those it is asked for.
            let file_address = probe.wrapping_sub(self.modules[i].bias);
            wanted.entry(i).or_default().push(file_address);
        }
        // Several mappings of one file (rare) are merged into one pass.
        let mut by_file: HashMap<&FileKey, Vec<u64>> = HashMap::new();
        for (i, addresses) in wanted {
            by_file
                .entry(&self.modules[i].file)
                .or_default()
                .extend(addresses);
        }
        for (key, addresses) in by_file {
            if !self.files.contains_key(key) {
                self.files.insert(key.clone(), FileNames::default());
            }
            if let Some(file) = self.files.get_mut(key) {
                file.name_all(key, addresses);
            }
        }
    }

    /// The main executable's path, once it was read for names, if it has no debug info
    /// (`debug = 0`, `strip = "debuginfo"`): its inlined functions then count in the
    /// functions they were inlined into, and no profile can say otherwise.
    pub(crate) fn executable_without_debug_info(&self) -> Option<&Path> {
        self.files.iter().find_map(|(key, names)| {
            let debug = names.debug.as_ref()?.as_ref()?;
            (key.read_from == Path::new(SELF_EXE) && debug.index.is_empty())
                .then_some(key.path.as_path())
        })
    }

    /// Symbolizes one sampled frame. `return_address` is true for every frame but the
    /// interrupted instruction: the call is the instruction before the return address.
    pub(crate) fn frame(&mut self, address: u64, return_address: bool) -> SymbolizedFrame {
        let probe = probe(address, return_address);
        let lines = match module_index(&self.modules, probe) {
            None => vec![FrameLine {
                function: Arc::from(format!("{probe:#x}")),
                file: None,
                line: None,
            }],
            Some(i) => {
                let module = &self.modules[i];
                let file_address = probe.wrapping_sub(module.bias);
                // Two lookups rather than `entry`: the key (a path) is cloned only once
                // per file, not per address.
                if !self.files.contains_key(&module.file) {
                    self.files.insert(module.file.clone(), FileNames::default());
                }
                match self.files.get_mut(&module.file) {
                    Some(file) => file.lines(&module.file, file_address).to_vec(),
                    None => vec![unknown(&module.file.path, file_address)],
                }
            }
        };
        SymbolizedFrame { address, lines }
    }
}

/// The address to look up for a sampled one.
fn probe(address: u64, return_address: bool) -> u64 {
    if return_address {
        address.saturating_sub(1)
    } else {
        address
    }
}

impl FileNames {
    /// The (cached) lines for `file_address` of `file`.
    fn lines(&mut self, file: &FileKey, file_address: u64) -> Arc<[FrameLine]> {
        if let Some(lines) = self.names.get(&file_address) {
            return lines.clone();
        }
        self.name_all(file, vec![file_address]);
        match self.names.get(&file_address) {
            Some(lines) => lines.clone(),
            None => Arc::from(vec![unknown(&file.path, file_address)]),
        }
    }

    /// Names every address of `addresses` not cached yet, in one pass over the file.
    /// The names kept never pass [`MAX_NAMED_ADDRESSES`], within the pass too: when they
    /// would, those not among `addresses` are forgotten, and new addresses past the cap
    /// are not named (the encoder's batches keep a pass within it; `lines` names one
    /// alone when asked).
    fn name_all(&mut self, key: &FileKey, mut addresses: Vec<u64>) {
        let path = key.path.as_path();
        addresses.sort_unstable();
        addresses.dedup();
        let wanted = addresses.clone();
        addresses.retain(|a| !self.names.contains_key(a));
        if addresses.is_empty() {
            return;
        }
        if self.names.len() + addresses.len() > MAX_NAMED_ADDRESSES {
            // Bounded: a long-running service keeps sampling addresses it has not seen
            // (rare paths). Starting over costs one pass naming the hot ones again; the
            // ones this pass was asked for stay.
            self.names.retain(|a, _| wanted.binary_search(a).is_ok());
            self.strings.clear();
            for lines in self.names.values() {
                for line in lines.iter() {
                    self.strings.insert(line.function.clone());
                    self.strings.extend(line.file.clone());
                }
            }
            self.clears += 1;
            addresses.truncate(MAX_NAMED_ADDRESSES - self.names.len());
        }
        let FileNames {
            debug,
            vdso,
            names,
            strings,
            clears: _,
            #[cfg(test)]
            passes,
        } = self;
        #[cfg(test)]
        {
            *passes += 1;
        }
        let mut intern = |s: &str| -> Arc<str> {
            if let Some(interned) = strings.get(s) {
                return interned.clone();
            }
            let interned: Arc<str> = Arc::from(s);
            strings.insert(interned.clone());
            interned
        };
        if path == Path::new(VDSO) {
            let symbols = vdso.get_or_insert_with(MemorySymbols::vdso);
            for address in addresses {
                let name = symbols.as_ref().and_then(|s| s.containing(address));
                let line = match name {
                    Some(function) => FrameLine {
                        function,
                        file: None,
                        line: None,
                    },
                    None => unknown(path, address),
                };
                names.insert(address, Arc::from(vec![line]));
            }
            return;
        }
        let unknown_all = |names: &mut HashMap<u64, Arc<[FrameLine]>>, addresses: &[u64]| {
            for &address in addresses {
                names.insert(address, Arc::from(vec![unknown(path, address)]));
            }
        };
        let file = debug.get_or_insert_with(|| FileDebug::open(key));
        let Some(file) = file else {
            return unknown_all(names, &addresses);
        };
        let data = file.mapped.bytes();
        let Ok(object) = object::File::parse(data) else {
            return unknown_all(names, &addresses);
        };
        let dwarf = dwarf::load(&object);
        let touch = |bytes| file.mapped.touch(bytes);
        let found = match &dwarf {
            Some(d) if !file.index.is_empty() => {
                let split = dwarf::SplitSource {
                    files: &file.split,
                    package: split::package_path(&key.path),
                };
                dwarf::Pass::new(d, &file.index, &touch, Some(split))
                    .resolve(&addresses, &mut intern)
            }
            _ => vec![dwarf::Found::default(); addresses.len()],
        };
        for (address, found) in addresses.into_iter().zip(found) {
            let lines = if found.frames.is_empty() {
                // Not named by debug info: the symbol table (libc, stripped files).
                let symbols = file.symbols.get_or_insert_with(|| {
                    let symbols = SymbolTable::parse(&object, data);
                    // The whole symbol and string tables were read: a big binary's are
                    // megabytes of file pages that this pass does not need again.
                    file.mapped.release();
                    symbols
                });
                match symbols.containing(address, data) {
                    Some(symbol) => {
                        let (file, line) = found.location.unwrap_or((None, None));
                        vec![FrameLine {
                            function: intern(&demangle(symbol, None)),
                            file,
                            line,
                        }]
                    }
                    None => vec![unknown(path, address)],
                }
            } else if found.bare_function {
                // `line-tables-only`: the out-of-line function's full path is its
                // symbol's (see `qualify`); without one, its unit's crate.
                let symbols = file.symbols.get_or_insert_with(|| {
                    let symbols = SymbolTable::parse(&object, data);
                    file.mapped.release();
                    symbols
                });
                let mut frames = found.frames;
                if let Some(last) = frames.last_mut() {
                    let named = match symbols.containing(address, data) {
                        Some(symbol) => Some(demangle(symbol, None).into_owned()),
                        None => found
                            .unit_crate
                            .as_deref()
                            .map(|krate| format!("{krate}::{}", last.function)),
                    };
                    if let Some(named) = named {
                        last.function = intern(&named);
                    }
                }
                // Closures written in it take its path (`qualify`'s `InFunction`), and
                // paths within an unnamed unit crate its crate when it is that crate's
                // code (`InUnitCrate`).
                if let Some(last) = frames.last().cloned() {
                    let function = last.function;
                    let users = last
                        .file
                        .as_deref()
                        .is_some_and(|f| qualify::crate_of_file(f).is_none());
                    let krate = function
                        .split_once("::")
                        .map(|(k, _)| k)
                        .filter(|k| users && !k.is_empty() && !k.starts_with('<'));
                    if let Some(krate) = krate {
                        for &i in &found.in_unit_crate {
                            if let Some(frame) = frames.get_mut(i) {
                                frame.function = intern(&format!("{krate}::{}", frame.function));
                            }
                        }
                    }
                    if !qualify::is_bare(&function) {
                        let path = qualify::without_generics(&function);
                        for (i, suffix) in &found.closures_in_function {
                            if let Some(frame) = frames.get_mut(*i) {
                                frame.function = intern(&format!("{path}::{suffix}"));
                            }
                        }
                    }
                }
                frames
            } else {
                found.frames
            };
            names.insert(address, Arc::from(lines));
        }
        file.split.between_passes();
    }
}

/// `name` demangled the way `language` mangles (Rust or C++; without a language, Rust,
/// then C++), Rust names without their hash suffix; unchanged if it does not demangle.
fn demangle(name: &str, language: Option<gimli::DwLang>) -> Cow<'_, str> {
    let rust = |name: &str| {
        rustc_demangle::try_demangle(name)
            .ok()
            .map(|d| format!("{d:#}"))
    };
    let cpp = |name: &str| {
        cpp_demangle::Symbol::new(name)
            .ok()
            .and_then(|s| s.demangle().ok())
    };
    let demangled = match language {
        Some(gimli::DW_LANG_Rust) => rust(name),
        Some(
            gimli::DW_LANG_C_plus_plus
            | gimli::DW_LANG_C_plus_plus_03
            | gimli::DW_LANG_C_plus_plus_11
            | gimli::DW_LANG_C_plus_plus_14
            | gimli::DW_LANG_C_plus_plus_17
            | gimli::DW_LANG_C_plus_plus_20,
        ) => cpp(name),
        Some(_) => None,
        None => rust(name).or_else(|| cpp(name)),
    };
    demangled.map_or(Cow::Borrowed(name), Cow::Owned)
}

/// The function symbols of an ELF image, by address in the image.
struct MemorySymbols {
    /// (address, size, demangled name), sorted by address.
    symbols: Vec<(u64, u64, Arc<str>)>,
}

impl MemorySymbols {
    /// The symbols of this process's vDSO, `None` without one or if it cannot be parsed.
    fn vdso() -> Option<MemorySymbols> {
        MemorySymbols::parse(&vdso_image()?)
    }

    /// The defined function symbols of the ELF `image` (`.symtab`, else `.dynsym`).
    fn parse(image: &[u8]) -> Option<MemorySymbols> {
        use object::{Object, ObjectSymbol, SymbolKind};
        let file = object::File::parse(image).ok()?;
        let mut symbols: Vec<(u64, u64, Arc<str>)> = file
            .symbols()
            .chain(file.dynamic_symbols())
            .filter(|s| s.is_definition() && s.kind() == SymbolKind::Text)
            .filter_map(|s| {
                let name = s.name().ok()?;
                Some((
                    s.address(),
                    s.size(),
                    Arc::from(demangle(name, None).as_ref()),
                ))
            })
            .collect();
        // At one address, the `__vdso_` name first: it says where the code lives, where
        // `clock_gettime` could be libc's.
        symbols.sort_by(|a, b| {
            a.0.cmp(&b.0)
                .then(b.2.starts_with("__vdso_").cmp(&a.2.starts_with("__vdso_")))
        });
        symbols.dedup_by_key(|s| s.0);
        Some(MemorySymbols { symbols })
    }

    /// The nearest symbol at or below `address` that spans it.
    fn containing(&self, address: u64) -> Option<Arc<str>> {
        let i = self.symbols.partition_point(|s| s.0 <= address);
        let (start, size, name) = self.symbols[..i].last()?;
        (address - start < (*size).max(1)).then(|| name.clone())
    }
}

/// A copy of this process's vDSO ELF image, `None` without one.
fn vdso_image() -> Option<Vec<u8>> {
    // SAFETY: getauxval only reads the auxiliary vector the kernel gave the process.
    let base = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
    if base == 0 {
        return None;
    }
    let base = base as u64;
    // The image's extent: the readable `[vdso]` mapping that starts at `base`.
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let end = maps.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (range, perms) = (fields.next()?, fields.next()?);
        if fields.last() != Some(VDSO) || !perms.starts_with('r') {
            return None;
        }
        let (start, end) = range.split_once('-')?;
        let start = u64::from_str_radix(start, 16).ok()?;
        let end = u64::from_str_radix(end, 16).ok()?;
        (start == base && end > start).then_some(end)
    })?;
    let len = usize::try_from(end - base).ok()?;
    // SAFETY: [base, end) is a mapping of this process that the kernel lists as readable
    // (checked above), and the vDSO is mapped for the life of the process, so the bytes
    // stay valid while they are copied.
    let image = unsafe { std::slice::from_raw_parts(base as usize as *const u8, len) };
    Some(image.to_vec())
}

/// The position in `modules` (sorted by code start) of the one whose code contains
/// `address`.
fn module_index(modules: &[ModuleMap], address: u64) -> Option<usize> {
    let i = modules.partition_point(|m| m.code.start <= address);
    let i = i.checked_sub(1)?;
    modules[i].code.contains(&address).then_some(i)
}

/// `file+0x…` for an address of a file whose debug info and symbols do not name it.
fn unknown(path: &Path, file_address: u64) -> FrameLine {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    FrameLine {
        function: Arc::from(format!("{name}+{file_address:#x}")),
        file: None,
        line: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn a_known_function() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn names_a_function_of_this_binary() {
        let mut symbolizer = Symbolizer::new();
        let address = a_known_function as fn() -> u64 as usize as u64;
        let frame = symbolizer.frame(address, false);
        let names: Vec<&str> = frame.lines.iter().map(|l| &*l.function).collect();
        assert!(
            names.iter().any(|n| n.ends_with("a_known_function")),
            "{names:?}"
        );
        assert!(
            names.iter().all(|n| !n.contains("::h")),
            "hash suffix kept: {names:?}"
        );
        // Cached: the same answer again.
        assert_eq!(symbolizer.frame(address, false).lines, frame.lines);
    }

    /// The loaded objects that have a file, as `Symbolizer::refresh` lists them.
    fn listed_modules() -> Vec<ModuleMap> {
        modules::list()
            .objects
            .iter()
            .filter_map(ModuleMap::of)
            .collect()
    }

    #[test]
    fn finds_the_main_executable_and_libc() {
        let modules = listed_modules();
        let function = a_known_function as fn() -> u64 as usize as u64;
        let exe = modules
            .iter()
            .find(|m| m.code.contains(&function))
            .expect("the test binary");
        assert_eq!(
            Some(exe.file.path.clone()),
            std::env::current_exe().ok(),
            "the loader's \"\" is the executable"
        );
        assert!(exe.file.id.is_some(), "the executable's file identity");
        assert!(modules
            .iter()
            .any(|m| m.file.path.to_string_lossy().contains("libc")));
        // The vDSO has no file: it is listed under its own name, read from memory.
        assert!(modules.iter().any(|m| m.file.path == Path::new(VDSO)));
    }

    #[test]
    fn names_clock_gettime_in_the_vdso() {
        let image = vdso_image().expect("a vDSO");
        let vdso = MemorySymbols::parse(&image).expect("the vDSO parses");
        let (start, size, name) = vdso
            .symbols
            .iter()
            .find(|s| s.2.contains("clock_gettime"))
            .expect("the vDSO exports clock_gettime")
            .clone();
        assert!(size > 8, "{name}: {size} bytes");
        let module = listed_modules()
            .into_iter()
            .find(|m| m.file.path == Path::new(VDSO))
            .expect("the vDSO is listed");
        let mut symbolizer = Symbolizer::new();
        let frame = symbolizer.frame(module.bias + start + size / 2, false);
        let names: Vec<&str> = frame.lines.iter().map(|l| &*l.function).collect();
        assert_eq!(names, [&*name], "an address inside {name}");
        assert!(name.contains("clock_gettime"), "{name}");
    }

    #[test]
    fn names_getpid_in_libc_from_its_symbol_table() {
        // SAFETY: dlsym on RTLD_DEFAULT with a NUL-terminated name only looks it up.
        let getpid = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"getpid".as_ptr()) } as u64;
        assert_ne!(getpid, 0, "getpid resolves");
        let mut symbolizer = Symbolizer::new();
        // A few bytes in: a sampled instruction inside the function, not its first.
        let frame = symbolizer.frame(getpid + 4, false);
        let names: Vec<&str> = frame.lines.iter().map(|l| &*l.function).collect();
        assert!(names.iter().any(|n| n.contains("getpid")), "{names:?}");
    }

    /// Makes `path` the only object, mapped with `bias` over `text`.
    fn map_only(symbolizer: &mut Symbolizer, file: &FileKey, bias: u64, text: Range<u64>) {
        symbolizer.remap(vec![ModuleMap {
            file: file.clone(),
            bias,
            code: text,
        }]);
    }

    /// One object unloaded and another loaded at the same addresses (here: the test binary,
    /// then libc, mapped by hand at a made-up place): addresses there get the second
    /// object's names, not the first one's from the cache.
    #[test]
    fn another_object_at_the_same_address_gets_its_own_names() {
        let function = a_known_function as fn() -> u64 as usize as u64;
        let listed = listed_modules();
        let exe = listed
            .iter()
            .find(|m| m.code.contains(&function))
            .expect("the test binary");
        let libc = listed
            .iter()
            .find(|m| m.file.path.to_string_lossy().contains("libc.so"))
            .expect("libc");
        let bias = 0x7e00_0000_0000;
        let address = bias + (function - exe.bias);
        let text = address - 0x1000..address + 0x1000;
        let names = |frame: &SymbolizedFrame| -> Vec<String> {
            frame.lines.iter().map(|l| l.function.to_string()).collect()
        };

        let mut symbolizer = Symbolizer::new();
        map_only(&mut symbolizer, &exe.file, bias, text.clone());
        let first = names(&symbolizer.frame(address, false));
        assert!(
            first.iter().any(|n| n.ends_with("a_known_function")),
            "{first:?}"
        );

        map_only(&mut symbolizer, &libc.file, bias, text.clone());
        let second = names(&symbolizer.frame(address, false));
        let mut fresh = Symbolizer::new();
        map_only(&mut fresh, &libc.file, bias, text);
        assert_eq!(second, names(&fresh.frame(address, false)));
        assert!(
            second.iter().all(|n| !n.contains("a_known_function")),
            "the unloaded object's name: {second:?}"
        );
    }

    /// A library rebuilt at the same path and loaded at the same addresses (here: libc
    /// copied to a temp file, then replaced by another object) is another file.
    #[test]
    fn a_replaced_file_at_the_same_path_gets_its_own_names() {
        let listed = listed_modules();
        let libc = listed
            .iter()
            .find(|m| m.file.path.to_string_lossy().contains("libc.so"))
            .expect("libc");
        let other = listed
            .iter()
            .filter(|m| m.file.path != libc.file.path)
            .filter_map(|m| Some((std::fs::metadata(&m.file.path).ok()?.len(), m)))
            .min_by_key(|(size, _)| *size)
            .map(|(_, m)| m)
            .expect("another object with a file");
        let dir =
            std::env::temp_dir().join(format!("otel-profiling-symbolize-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("libplugin.so");
        std::fs::copy(&libc.file.path, &path).expect("copy libc");
        let bias = 0x7e00_0000_0000;
        let address = bias + (libc::getpid as *const () as usize as u64 - libc.bias);
        let text = bias..address + 0x1000;
        let names = |frame: &SymbolizedFrame| -> Vec<String> {
            frame.lines.iter().map(|l| l.function.to_string()).collect()
        };

        let mut symbolizer = Symbolizer::new();
        map_only(&mut symbolizer, &FileKey::at(&path), bias, text.clone());
        let first = names(&symbolizer.frame(address, false));
        assert!(first.iter().any(|n| n.contains("getpid")), "{first:?}");

        // Replaced the way a build does it: a new file renamed over the old one.
        let next = dir.join("libplugin.so.new");
        std::fs::copy(&other.file.path, &next).expect("copy the other object");
        std::fs::rename(&next, &path).expect("replace");
        map_only(&mut symbolizer, &FileKey::at(&path), bias, text.clone());
        let second = names(&symbolizer.frame(address, false));
        let mut fresh = Symbolizer::new();
        map_only(&mut fresh, &FileKey::at(&path), bias, text);
        let expected = names(&fresh.frame(address, false));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(second, expected);
        assert!(
            second.iter().all(|n| !n.contains("getpid")),
            "the replaced file's name: {second:?}"
        );
    }

    /// A library replaced on disk while it stays mapped (here: the path holds another
    /// object, and the mapping carries libc's build id, as the loaded image would): its
    /// frames are named by address, never with the new file's names; the main executable
    /// is read through `/proc/self/exe`, the image that runs. Before, names came from
    /// whatever file was at the path.
    #[test]
    fn a_file_replaced_while_mapped_gives_no_names_of_its_replacement() {
        let listed = listed_modules();
        let libc = listed
            .iter()
            .find(|m| m.file.path.to_string_lossy().contains("libc.so"))
            .expect("libc");
        let mapped_id = libc.file.build_id.clone().expect("libc has a build id");
        let exe = listed
            .iter()
            .find(|m| {
                m.code
                    .contains(&(a_known_function as fn() -> u64 as usize as u64))
            })
            .expect("the test binary");
        assert_eq!(exe.file.read_from, Path::new("/proc/self/exe"));
        assert!(
            exe.file.build_id.is_some(),
            "read from the mapped image's notes"
        );

        let dir =
            std::env::temp_dir().join(format!("otel-profiling-replaced-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("libc.so.6");
        let bias = 0x7e00_0000_0000;
        let address = bias + (libc::getpid as *const () as usize as u64 - libc.bias);
        let text = bias..address + 0x1000;
        let names_with = |file: &FileKey| -> Vec<String> {
            let mut symbolizer = Symbolizer::new();
            map_only(&mut symbolizer, file, bias, text.clone());
            let frame = symbolizer.frame(address, false);
            frame.lines.iter().map(|l| l.function.to_string()).collect()
        };
        // The same image at the path: named.
        std::fs::copy(&libc.file.path, &path).expect("copy libc");
        let same = FileKey {
            build_id: Some(mapped_id.clone()),
            ..FileKey::at(&path)
        };
        let named = names_with(&same);
        assert!(named.iter().any(|n| n.contains("getpid")), "{named:?}");
        // Another object at the path (the test binary, which has no `getpid`): by address.
        std::fs::copy(&exe.file.read_from, &path).expect("copy another object");
        let replaced = FileKey {
            build_id: Some(mapped_id),
            ..FileKey::at(&path)
        };
        let by_address = names_with(&replaced);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(by_address.len(), 1, "{by_address:?}");
        assert!(by_address[0].starts_with("libc.so.6+0x"), "{by_address:?}");
    }

    /// Names belong to the file: still cached when it is mapped elsewhere, forgotten once
    /// it is not mapped at all.
    #[test]
    fn names_follow_the_file_not_the_address() {
        let function = a_known_function as fn() -> u64 as usize as u64;
        let listed = listed_modules();
        let exe = listed
            .iter()
            .find(|m| m.code.contains(&function))
            .expect("the test binary");
        let libc = listed
            .iter()
            .find(|m| m.file.path.to_string_lossy().contains("libc.so"))
            .expect("libc");
        let file_address = function - exe.bias;
        let mut symbolizer = Symbolizer::new();
        let cached = |symbolizer: &Symbolizer| {
            symbolizer
                .files
                .get(&exe.file)
                .map_or(0, |file| file.names.len())
        };

        let here = 0x7e00_0000_0000;
        map_only(
            &mut symbolizer,
            &exe.file,
            here,
            here..here + file_address + 1,
        );
        let first = symbolizer.frame(here + file_address, false);
        assert_eq!(cached(&symbolizer), 1);

        let there = 0x7f00_0000_0000;
        map_only(
            &mut symbolizer,
            &exe.file,
            there,
            there..there + file_address + 1,
        );
        assert_eq!(cached(&symbolizer), 1, "kept while the file is mapped");
        assert_eq!(
            symbolizer.frame(there + file_address, false).lines,
            first.lines
        );
        assert_eq!(cached(&symbolizer), 1, "found by file address");

        map_only(&mut symbolizer, &libc.file, here, here..here + 1);
        assert_eq!(cached(&symbolizer), 0, "dropped with the file");
    }

    /// A long-running service keeps sampling new addresses: the names kept per file stay
    /// within the cap.
    #[test]
    fn the_names_kept_per_file_are_bounded() {
        let mut file = FileNames::default();
        let vdso = FileKey::at(VDSO);
        let step = (MAX_NAMED_ADDRESSES / 4) as u64;
        for round in 0..6u64 {
            file.name_all(&vdso, (round * step..(round + 1) * step).collect());
            assert!(
                file.names.len() <= MAX_NAMED_ADDRESSES,
                "{}",
                file.names.len()
            );
        }
        assert!(file.strings.len() <= file.names.len() + 1);
        // The newest addresses are named.
        assert!(file.names.contains_key(&(6 * step - 1)));
        assert_eq!(file.clears, 1);
    }

    /// Audit U10: after a clear, one pass inserted all of its new addresses, so a pass
    /// with more than the cap left the file's names past it until the next pass.
    #[test]
    fn one_pass_never_names_more_than_the_cap() {
        let mut file = FileNames::default();
        let vdso = FileKey::at(VDSO);
        let over = MAX_NAMED_ADDRESSES as u64 + 1000;
        file.name_all(&vdso, (0..over).collect());
        assert_eq!(file.names.len(), MAX_NAMED_ADDRESSES);
        // An address past the cap is still named when asked for, alone.
        assert!(!file.lines(&vdso, over - 1).is_empty());
        assert!(file.names.len() <= MAX_NAMED_ADDRESSES);
    }

    #[test]
    fn unknown_addresses_get_a_hex_name() {
        let mut symbolizer = Symbolizer::new();
        let frame = symbolizer.frame(0x10, false);
        assert_eq!(&*frame.lines[0].function, "0x10");
    }

    /// Builds the names fixture (`bridge/tests/fixtures/names`, one registry dependency)
    /// in release with `debug = <debug>`, and names every address of its out-of-line
    /// `catalog::hash_catalog`: the innermost-first function names of each.
    fn fixture_names(debug: &str, extra: &[(&str, &str)]) -> Option<Vec<Vec<String>>> {
        let Some(cargo) = std::env::var_os("CARGO") else {
            // Past the harness's capture, so that the skip shows (see tests/support/skip.rs).
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                b"SKIPPED names_carry_their_paths_under_every_debug_setting: CARGO is not set\n",
            );
            return None;
        };
        let manifest =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/names/Cargo.toml");
        let variant: String = extra.iter().map(|(k, v)| format!("-{k}={v}")).collect();
        let target = std::env::temp_dir().join(format!(
            "otel-profiling-names-fixture-{debug}{}",
            variant.to_lowercase()
        ));
        let status = std::process::Command::new(cargo)
            .args([
                "build",
                "--release",
                "--quiet",
                "--locked",
                "--manifest-path",
            ])
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target)
            .env("CARGO_PROFILE_RELEASE_DEBUG", debug)
            .envs(extra.iter().copied())
            .env_remove("RUSTFLAGS")
            .status()
            .expect("cargo runs");
        assert!(status.success(), "the fixture builds with debug = {debug}");
        let exe = target.join("release/names-fixture");
        let data = std::fs::read(&exe).expect("the fixture binary");
        let elf = object::File::parse(&*data).expect("ELF");
        use object::{Object as _, ObjectSymbol as _};
        let (start, size) = elf
            .symbols()
            .find(|s| {
                s.name()
                    .is_ok_and(|n| demangle(n, None).ends_with("catalog::hash_catalog"))
            })
            .map(|s| (s.address(), s.size()))
            .expect("hash_catalog's symbol");
        assert!(size > 0);
        let mut symbolizer = Symbolizer::new();
        map_only(&mut symbolizer, &FileKey::at(&exe), 0, start..start + size);
        let addresses: Vec<u64> = (start..start + size).collect();
        symbolizer.prepare(addresses.iter().map(|&a| (a, false)));
        Some(
            addresses
                .iter()
                .map(|&a| {
                    symbolizer
                        .frame(a, false)
                        .lines
                        .iter()
                        .map(|l| l.function.to_string())
                        .collect()
                })
                .collect(),
        )
    }

    /// Names under every common `debug` setting of the release profile: the out-of-line
    /// function always has its module path (DWARF linkage names, else the symbol table);
    /// where debug info has inlined frames, none is bare — under `line-tables-only` (the
    /// README's recommendation), whose DWARF keeps only bare names, they read
    /// `<crate>::<module>::<name>` (the user's crate from the compile unit, `itoa` from its
    /// registry path, the module from the file) and a closure reads as full debug info
    /// names it, in its function (`catalog::hash_catalog::{closure#0}`); `debug = 0` and `strip = "debuginfo"` have no inline information at all; split
    /// debug info (`split-debuginfo = "packed" | "unpacked"`: the entries in a `.dwp` or in
    /// `.dwo` files) names as the same setting unsplit does.
    #[test]
    fn names_carry_their_paths_under_every_debug_setting() {
        let settings: [(&str, &[(&str, &str)]); 8] = [
            ("line-tables-only", &[]),
            ("limited", &[]),
            ("full", &[]),
            ("0", &[]),
            ("full", &[("CARGO_PROFILE_RELEASE_STRIP", "debuginfo")]),
            (
                "line-tables-only",
                &[("CARGO_PROFILE_RELEASE_SPLIT_DEBUGINFO", "packed")],
            ),
            (
                "line-tables-only",
                &[("CARGO_PROFILE_RELEASE_SPLIT_DEBUGINFO", "unpacked")],
            ),
            (
                "limited",
                &[("CARGO_PROFILE_RELEASE_SPLIT_DEBUGINFO", "packed")],
            ),
        ];
        // Names and inlined count of each unsplit build, by `debug`.
        let mut plain = std::collections::HashMap::new();
        for (debug, extra) in settings {
            let Some(stacks) = fixture_names(debug, extra) else {
                return;
            };
            let level = debug;
            let debug = format!("{debug} {extra:?}");
            let mut names = std::collections::BTreeSet::new();
            for lines in &stacks {
                assert_eq!(
                    lines.last().map(String::as_str),
                    Some("names_fixture::catalog::hash_catalog"),
                    "debug = {debug}: {lines:?}"
                );
                names.extend(lines.iter().cloned());
            }
            let bare: Vec<&String> = names.iter().filter(|n| qualify::is_bare(n)).collect();
            assert!(
                bare.is_empty(),
                "debug = {debug}: bare names {bare:?} of {names:?}"
            );
            let inlined = stacks.iter().filter(|l| l.len() > 1).count();
            if debug.starts_with('0') || debug.contains("debuginfo") {
                assert_eq!(inlined, 0, "no inline information without debug info");
            } else if debug.contains("SPLIT") {
                // The same code as the plain `line-tables-only` build, its entries read
                // from the `.dwp` / `.dwo` files: the same names, as often inlined.
                let (plain_names, plain_inlined) =
                    plain.get(level).expect("the unsplit build comes first");
                assert_eq!(&names, plain_names, "debug = {debug}");
                assert_eq!(inlined, *plain_inlined, "debug = {debug}");
            } else {
                // The same paths full debug info gives, closures spelled as each names
                // them (`{{closure}}` in linkage names, `{closure#0}` in line tables).
                assert!(
                    names.contains("names_fixture::catalog::digest"),
                    "debug = {debug}: the user's inlined function: {names:?}"
                );
                assert!(
                    names
                        .iter()
                        .any(|n| n.starts_with("names_fixture::catalog::hash_catalog::{")),
                    "debug = {debug}: the user's closure, in its function: {names:?}"
                );
                assert!(
                    !names.iter().any(|n| n.starts_with("names_fixture::{")),
                    "debug = {debug}: no closure without its function: {names:?}"
                );
                assert!(
                    names.iter().any(|n| n.starts_with("itoa::")),
                    "debug = {debug}: the registry crate's inlined code: {names:?}"
                );
            }
            if extra.is_empty() {
                plain.insert(level, (names.clone(), inlined));
            }
            eprintln!(
                "debug = {debug}: {} addresses, {inlined} with inlined frames, {} names: {:?}",
                stacks.len(),
                names.len(),
                names
                    .iter()
                    .filter(|n| n.contains("digest") || n.starts_with("itoa::"))
                    .collect::<Vec<_>>()
            );
        }
    }
}
