//! Whether the caller threads of a cooperative call agree on what the call is: one `nth` for
//! all, each `ith` of `0..nth` exactly once, and every one of them there before the first
//! barrier returns. A caller that breaks this (a mistyped descriptor, a barrier that gives up)
//! gets `INVALID_ARGUMENT` naming what went wrong, on every thread, before anything is written.
//!
//! On the normal path this is an atomic swap when a thread joins, an atomic add before the first
//! barrier, and one decision after it that the first thread out makes and the others read.

use super::{Error, ErrorKind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The agreement of one cooperative call's caller threads.
pub(super) struct Agreement {
    /// The call's `nth`, as its first thread gave it.
    nth: usize,
    /// Which `ith` joined.
    joined: Vec<AtomicBool>,
    /// Threads that joined.
    came: AtomicUsize,
    /// Threads done with their part before the first barrier.
    ready: AtomicUsize,
    /// The first disagreement seen as the threads joined.
    conflict: OnceLock<String>,
    /// Decided once, after the first barrier.
    verdict: OnceLock<Result<(), Error>>,
}

impl Agreement {
    pub fn new(nth: usize) -> Agreement {
        Agreement {
            nth,
            joined: (0..nth).map(|_| AtomicBool::new(false)).collect(),
            came: AtomicUsize::new(0),
            ready: AtomicUsize::new(0),
            conflict: OnceLock::new(),
            verdict: OnceLock::new(),
        }
    }

    /// A thread with descriptor `(ith, nth)` joins the call.
    pub fn join(&self, ith: usize, nth: usize) {
        self.came.fetch_add(1, Ordering::Relaxed);
        if nth != self.nth {
            self.conflict(format!(
                "threads: one thread passed nth = {}, another nth = {nth}: every thread of a \
                 cooperative call passes the same nth",
                self.nth
            ));
        } else if self.joined[ith].swap(true, Ordering::Relaxed) {
            self.conflict(format!(
                "threads: two threads passed ith = {ith} (nth = {nth}): each of 0..nth is \
                 passed by exactly one thread"
            ));
        }
    }

    /// Whether `nth` threads joined.
    pub fn all_joined(&self) -> bool {
        self.came.load(Ordering::Relaxed) >= self.nth
    }

    fn conflict(&self, message: String) {
        // The first one is reported; a later one is a consequence of the same mistake.
        let _ = self.conflict.set(message);
    }

    /// This thread has done its part before the first barrier (and is about to enter it).
    pub fn ready(&self) {
        self.ready.fetch_add(1, Ordering::Release);
    }

    /// After the first barrier: `Ok` if the threads agree. Decided by `decide` (which ends in
    /// [`Agreement::decide`]) for the first thread to ask, which gets `true` as well; every
    /// other thread reads the same answer.
    pub fn verdict(
        &self,
        decide: impl FnOnce() -> Result<(), Error>,
    ) -> (&Result<(), Error>, bool) {
        let mut decided = false;
        let verdict = self.verdict.get_or_init(|| {
            decided = true;
            decide()
        });
        (verdict, decided)
    }

    /// Whether the threads that joined and got ready so far agree.
    pub fn decide(&self) -> Result<(), Error> {
        let invalid = |message: String| Err(Error::new(ErrorKind::InvalidArgument, message));
        if let Some(message) = self.conflict.get() {
            return invalid(message.clone());
        }
        let ready = self.ready.load(Ordering::Acquire);
        if ready >= self.nth {
            return Ok(());
        }
        let missing: Vec<String> = (0..self.nth)
            .filter(|&i| !self.joined[i].load(Ordering::Relaxed))
            .map(|i| i.to_string())
            .collect();
        let which = if missing.is_empty() {
            String::new()
        } else {
            format!(" (ith {} never came)", missing.join(", "))
        };
        invalid(format!(
            "threads: {ready} of the nth = {} threads reached the first barrier before it \
             returned{which}: the barrier must wait for all nth threads",
            self.nth
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(a: &Agreement) -> String {
        match a.verdict(|| a.decide()).0 {
            Ok(()) => String::new(),
            Err(e) => {
                assert_eq!(e.kind, ErrorKind::InvalidArgument);
                e.message().into_owned()
            }
        }
    }

    fn all_join(a: &Agreement, descriptors: &[(usize, usize)]) {
        for &(ith, nth) in descriptors {
            a.join(ith, nth);
            a.ready();
        }
    }

    #[test]
    fn threads_that_agree_pass_and_the_first_to_ask_decides() {
        let a = Agreement::new(3);
        all_join(&a, &[(2, 3), (0, 3), (1, 3)]);
        assert_eq!(a.verdict(|| a.decide()), (&Ok(()), true));
        assert_eq!(a.verdict(|| a.decide()), (&Ok(()), false));
    }

    #[test]
    fn each_disagreement_is_named() {
        let a = Agreement::new(3);
        all_join(&a, &[(0, 3), (1, 2), (2, 3)]);
        assert!(
            message(&a).contains("nth = 3, another nth = 2"),
            "{}",
            message(&a)
        );

        let a = Agreement::new(3);
        all_join(&a, &[(0, 3), (1, 3), (1, 3)]);
        assert!(
            message(&a).contains("two threads passed ith = 1"),
            "{}",
            message(&a)
        );

        let a = Agreement::new(4);
        all_join(&a, &[(0, 4), (3, 4)]);
        let m = message(&a);
        assert!(
            m.contains("2 of the nth = 4 threads") && m.contains("ith 1, 2 never came"),
            "{m}"
        );

        // All joined, one still short of the barrier when it returned.
        let a = Agreement::new(2);
        all_join(&a, &[(0, 2)]);
        a.join(1, 2);
        let m = message(&a);
        assert!(
            m.contains("1 of the nth = 2 threads") && !m.contains("never came"),
            "{m}"
        );
        // Decided once: the late thread reads the same answer.
        a.ready();
        assert!(!a.verdict(|| a.decide()).1);
        assert_eq!(message(&a), m);
    }
}
