//! Crate-internal macros.

/// The inner-service accessors every service of the crate has: `get_ref`,
/// `get_mut` and `into_inner`, reaching the field that holds the wrapped
/// service.
///
/// ```ignore
/// impl<S> Timeout<S> {
///     inner_accessors!(inner: S);
/// }
/// ```
///
/// A service that must know when its inner service may have changed runs a
/// statement before handing it out mutably, and says so in `get_mut`'s doc:
///
/// ```ignore
/// inner_accessors!(inner: S;
///     /// Retries after this go to clones of the service as changed.
///     get_mut: |s| s.stale = true);
/// ```
///
/// A service whose inner service sits deeper names the three paths:
///
/// ```ignore
/// inner_accessors!(S, |s| s.inner.get_ref().0, |s| s.inner.get_mut().0, |s| s.inner.into_inner().0);
/// ```
macro_rules! inner_accessors {
    ($inner:ty, |$r:ident| $get_ref:expr, |$m:ident| $get_mut:expr, |$i:ident| $into:expr) => {
        /// The inner service.
        pub fn get_ref(&self) -> &$inner {
            let $r = self;
            &$get_ref
        }

        /// The inner service, mutably.
        pub fn get_mut(&mut self) -> &mut $inner {
            let $m = self;
            &mut $get_mut
        }

        /// The inner service, unwrapped.
        pub fn into_inner(self) -> $inner {
            let $i = self;
            $into
        }
    };
    ($field:ident : $inner:ty; $(#[$doc:meta])* get_mut: |$m:ident| $touch:expr) => {
        /// The inner service.
        pub fn get_ref(&self) -> &$inner {
            &self.$field
        }

        /// The inner service, mutably.
        $(#[$doc])*
        pub fn get_mut(&mut self) -> &mut $inner {
            let $m = &mut *self;
            $touch;
            &mut self.$field
        }

        /// The inner service, unwrapped.
        pub fn into_inner(self) -> $inner {
            self.$field
        }
    };
    ($field:ident : $inner:ty) => {
        /// The inner service.
        pub fn get_ref(&self) -> &$inner {
            &self.$field
        }

        /// The inner service, mutably.
        pub fn get_mut(&mut self) -> &mut $inner {
            &mut self.$field
        }

        /// The inner service, unwrapped.
        pub fn into_inner(self) -> $inner {
            self.$field
        }
    };
}
