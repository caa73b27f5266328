//! Wire types of Google's pprof `profile.proto` (package `perftools.profiles`).
//!
//! Written by hand with `prost` derives instead of generated at build time, so the crate
//! needs no `protoc`. Field numbers and types follow `profile.proto` exactly. Every
//! `i64` documented as a "string index" points into [`Profile::string_table`], whose
//! entry 0 must be `""`.

/// A whole profile: samples plus the tables they refer to.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    /// What each entry of [`Sample::value`] measures, in the same order.
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    /// The samples.
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    /// Memory mappings of the profiled process.
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    /// Locations (addresses) referenced by samples.
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    /// Functions referenced by locations.
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// All strings of the profile; entry 0 must be `""`.
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    /// String index of a regex: frames matching it (and above) are dropped by viewers.
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    /// String index of a regex: frames matching it are kept despite `drop_frames`.
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    /// Start of the profiled interval, nanoseconds since the Unix epoch.
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    /// Length of the profiled interval, nanoseconds.
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    /// What one sampling period measures.
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    /// Sampling period, in units of `period_type`.
    #[prost(int64, tag = "12")]
    pub period: i64,
    /// String indices of free-form comments.
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    /// String index of the sample type viewers show by default.
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
    /// String index of a documentation URL for this profile type.
    #[prost(int64, tag = "15")]
    pub doc_url: i64,
}

/// A measured quantity: its type and unit (both string indices), e.g. `cpu`/`nanoseconds`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    /// String index of the type.
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// String index of the unit.
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// One stack with its measured values and labels.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// Location ids, leaf (innermost) first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    /// One value per [`Profile::sample_type`].
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    /// Labels of this sample.
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// A key with either a string value (`str`) or a numeric one (`num`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    /// String index of the key.
    #[prost(int64, tag = "1")]
    pub key: i64,
    /// String index of the value, for string labels.
    #[prost(int64, tag = "2")]
    pub str: i64,
    /// Value, for numeric labels.
    #[prost(int64, tag = "3")]
    pub num: i64,
    /// String index of the unit of `num`.
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// A mapped binary or library.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    /// Unique nonzero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// First address of the mapping.
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    /// Address just past the mapping.
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    /// Offset of `memory_start` in the file.
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    /// String index of the file path.
    #[prost(int64, tag = "5")]
    pub filename: i64,
    /// String index of the build id.
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    /// Locations in this mapping carry function names.
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    /// Locations in this mapping carry file names.
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    /// Locations in this mapping carry line numbers.
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    /// Locations in this mapping carry inlined frames.
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// An address, with the source lines it symbolizes to.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    /// Unique nonzero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Id of the containing [`Mapping`], 0 when unknown.
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    /// Instruction address.
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// Source lines; several when inlined, innermost first and the caller last.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    /// The frames were folded (e.g. by identical code folding).
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

/// One source position of a [`Location`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    /// Id of the [`Function`].
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    /// Line number, 0 when unknown.
    #[prost(int64, tag = "2")]
    pub line: i64,
    /// Column number, 0 when unknown.
    #[prost(int64, tag = "3")]
    pub column: i64,
}

/// A function (name and source file).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    /// Unique nonzero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// String index of the human-readable (demangled) name.
    #[prost(int64, tag = "2")]
    pub name: i64,
    /// String index of the system (possibly mangled) name.
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    /// String index of the source file.
    #[prost(int64, tag = "4")]
    pub filename: i64,
    /// First line of the function, 0 when unknown.
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}
