//! The paths of the layer that the integration tests do not reach: the
//! key lookup under threads.

use std::sync::Arc;

use super::limiter::Limiter;
use super::ModelRateLimitLayer;

#[test]
fn every_thread_finds_the_same_state_for_a_key() {
    let limiter = Arc::new(Limiter::new(ModelRateLimitLayer::builder()));
    let found: Vec<_> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let limiter = &limiter;
                scope.spawn(move || {
                    let key = if i % 2 == 0 { "first" } else { "second" };
                    (key, limiter.key(key))
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (key, state) in &found {
        assert_eq!(state.key(), *key);
        assert!(Arc::ptr_eq(state, &limiter.key(key)));
    }
    assert!(!Arc::ptr_eq(&limiter.key("first"), &limiter.key("second")));
    // A third key, after both are known, is its own too.
    assert_eq!(limiter.key("third").key(), "third");
    assert!(Arc::ptr_eq(&limiter.key("third"), &limiter.key("third")));
}
