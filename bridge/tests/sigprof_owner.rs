//! A process whose SIGPROF already belongs to another profiler: the sampler refuses to
//! start with a clear error instead of stealing the signal. (Own test binary: the
//! disposition is process-wide.)

use otel_profiling::sampler::{Sampler, SamplerConfig, SamplerError};

extern "C" fn foreign_handler(_: libc::c_int) {}

#[test]
fn refuses_when_another_profiler_owns_sigprof() {
    // SAFETY: installing a do-nothing handler, as another profiler would.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = foreign_handler as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGPROF, &action, std::ptr::null_mut()),
            0
        );
    }
    let err = Sampler::start(SamplerConfig::default()).expect_err("must refuse");
    assert!(matches!(err, SamplerError::SigprofTaken), "{err:?}");
    assert!(err.to_string().contains("only one SIGPROF owner"), "{err}");
    // Refusing left the other profiler's handler in place.
    // SAFETY: reading the disposition.
    let current = unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGPROF, std::ptr::null(), &mut old);
        old.sa_sigaction
    };
    assert_eq!(
        current,
        foreign_handler as extern "C" fn(libc::c_int) as usize
    );
    // And a refused start does not count as running.
    // SAFETY: restoring the default disposition.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGPROF, &action, std::ptr::null_mut());
    }
    Sampler::start(SamplerConfig::default()).expect("starts once SIGPROF is free");
}
