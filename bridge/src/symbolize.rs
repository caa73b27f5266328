//! Turning sampled addresses into function names, files and lines, off the hot path.
//!
//! Runs on the collector thread only. Debug info is loaded lazily, once per module, the
//! first time one of its addresses needs a name, so start-up never pays for it. Results
//! are cached per address. Names are demangled without the Rust hash suffix. Without
//! debug info (a default `--release` build) names come from the symbol table and carry no
//! file or line; `debug = "line-tables-only"` in the release profile adds them.

use std::collections::HashMap;
use std::ffi::CStr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::pprof::{FrameLine, SymbolizedFrame};

/// One loaded ELF object: where it is mapped and where its file is.
#[derive(Clone, Debug)]
struct ModuleMap {
    path: PathBuf,
    /// Load bias: file address = runtime address − bias.
    bias: u64,
    /// Executable runtime ranges.
    text: Vec<std::ops::Range<u64>>,
}

/// Resolves addresses of the running process.
pub(crate) struct Symbolizer {
    modules: Vec<ModuleMap>,
    loaders: HashMap<PathBuf, Option<addr2line::Loader>>,
    cache: HashMap<u64, Arc<[FrameLine]>>,
}

impl Symbolizer {
    pub(crate) fn new() -> Symbolizer {
        Symbolizer {
            modules: loaded_modules(),
            loaders: HashMap::new(),
            cache: HashMap::new(),
        }
    }

    /// Re-reads the module list (after `dlopen`); cached names stay valid for addresses
    /// of modules that are still mapped.
    pub(crate) fn refresh(&mut self) {
        self.modules = loaded_modules();
    }

    /// Symbolizes one sampled frame. `return_address` is true for every frame but the
    /// interrupted instruction: the call is the instruction before the return address.
    pub(crate) fn frame(&mut self, address: u64, return_address: bool) -> SymbolizedFrame {
        let probe = if return_address {
            address.saturating_sub(1)
        } else {
            address
        };
        let lines = match self.cache.get(&probe) {
            Some(lines) => lines.clone(),
            None => {
                let lines: Arc<[FrameLine]> = self.resolve(probe).into();
                self.cache.insert(probe, lines.clone());
                lines
            }
        };
        SymbolizedFrame {
            address,
            lines: lines.to_vec(),
        }
    }

    fn resolve(&mut self, address: u64) -> Vec<FrameLine> {
        let Some(module) = self
            .modules
            .iter()
            .find(|m| m.text.iter().any(|r| r.contains(&address)))
            .cloned()
        else {
            return vec![unknown(address, None)];
        };
        let probe = address.wrapping_sub(module.bias);
        let loader = self
            .loaders
            .entry(module.path.clone())
            .or_insert_with(|| addr2line::Loader::new(&module.path).ok());
        let Some(loader) = loader else {
            return vec![unknown(address, Some(&module))];
        };
        let mut lines = Vec::new();
        if let Ok(mut frames) = loader.find_frames(probe) {
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
            if let Some(symbol) = loader.find_symbol(probe) {
                let name = addr2line::demangle_auto(symbol.into(), None);
                let location = loader.find_location(probe).ok().flatten();
                lines.push(FrameLine {
                    function: Arc::from(name.as_ref()),
                    file: location.as_ref().and_then(|l| l.file).map(Arc::from),
                    line: location.and_then(|l| l.line),
                });
            }
        }
        if lines.is_empty() {
            lines.push(unknown(address, Some(&module)));
        }
        lines
    }
}

fn unknown(address: u64, module: Option<&ModuleMap>) -> FrameLine {
    let function = match module {
        Some(m) => {
            let name = m
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            format!("{name}+{:#x}", address.wrapping_sub(m.bias))
        }
        None => format!("{address:#x}"),
    };
    FrameLine {
        function: Arc::from(function),
        file: None,
        line: None,
    }
}

/// The loaded ELF objects that have a file, from the dynamic loader's list.
fn loaded_modules() -> Vec<ModuleMap> {
    let mut modules: Vec<ModuleMap> = Vec::new();
    // SAFETY: the callback only reads the loader-provided structures during the call and
    // writes to the Vec passed as `data`.
    unsafe {
        libc::dl_iterate_phdr(
            Some(collect_module),
            &mut modules as *mut Vec<ModuleMap> as *mut libc::c_void,
        );
    }
    modules
}

unsafe extern "C" fn collect_module(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: `dl_iterate_phdr` passes a valid info and our `data` pointer.
    let (info, modules) = unsafe { (&*info, &mut *(data as *mut Vec<ModuleMap>)) };
    let name = if info.dlpi_name.is_null() {
        ""
    } else {
        // SAFETY: a NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(info.dlpi_name) }
            .to_str()
            .unwrap_or("")
    };
    let path = if name.is_empty() {
        match std::env::current_exe() {
            Ok(p) => p,
            Err(_) => return 0,
        }
    } else if name.starts_with("linux-vdso") || name.starts_with("linux-gate") {
        return 0; // no file to read
    } else {
        PathBuf::from(name)
    };
    let mut text = Vec::new();
    if !info.dlpi_phdr.is_null() {
        for i in 0..usize::from(info.dlpi_phnum) {
            // SAFETY: `dlpi_phdr` points at `dlpi_phnum` program headers.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            if ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_X != 0 {
                let start = info.dlpi_addr.wrapping_add(ph.p_vaddr);
                text.push(start..start.wrapping_add(ph.p_memsz));
            }
        }
    }
    modules.push(ModuleMap {
        path,
        bias: info.dlpi_addr,
        text,
    });
    0
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

    #[test]
    fn finds_the_main_executable_and_libc() {
        let modules = loaded_modules();
        assert!(modules.iter().any(|m| m
            .text
            .iter()
            .any(|r| r.contains(&(a_known_function as fn() -> u64 as usize as u64)))));
        assert!(modules
            .iter()
            .any(|m| m.path.to_string_lossy().contains("libc")));
    }

    #[test]
    fn unknown_addresses_get_a_hex_name() {
        let mut symbolizer = Symbolizer::new();
        let frame = symbolizer.frame(0x10, false);
        assert_eq!(&*frame.lines[0].function, "0x10");
    }
}
