//! [`ModelName`]: a model's name, shared rather than copied.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// The name of a model as the provider knows it, e.g. `"gpt-4o-mini"`.
///
/// A string behind an `Arc`: a retry, a fallback or a rate limiter copies a
/// pointer, not the name. It reads as a `&str` (`Deref`), compares with
/// strings, and serializes as a plain string.
///
/// ```
/// use tower_agent::types::ModelName;
///
/// let name = ModelName::from("gpt-4o-mini");
/// assert_eq!(name, "gpt-4o-mini");
/// assert!(name.starts_with("gpt"));
/// assert_eq!(String::from(name.clone()), "gpt-4o-mini");
/// assert_eq!(serde_json::to_string(&name).unwrap(), r#""gpt-4o-mini""#);
/// ```
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ModelName(Arc<str>);

impl ModelName {
    /// The name as a `&str`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for ModelName {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for ModelName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for ModelName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for ModelName {
    fn from(name: &str) -> Self {
        Self(Arc::from(name))
    }
}

impl From<&String> for ModelName {
    fn from(name: &String) -> Self {
        Self(Arc::from(name.as_str()))
    }
}

impl From<String> for ModelName {
    fn from(name: String) -> Self {
        Self(Arc::from(name))
    }
}

impl From<Arc<str>> for ModelName {
    fn from(name: Arc<str>) -> Self {
        Self(name)
    }
}

impl From<ModelName> for String {
    fn from(name: ModelName) -> Self {
        name.0.as_ref().to_owned()
    }
}

impl PartialEq<str> for ModelName {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for ModelName {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<String> for ModelName {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<ModelName> for str {
    fn eq(&self, other: &ModelName) -> bool {
        *self == *other.0
    }
}

impl PartialEq<ModelName> for &str {
    fn eq(&self, other: &ModelName) -> bool {
        **self == *other.0
    }
}

impl PartialEq<ModelName> for String {
    fn eq(&self, other: &ModelName) -> bool {
        **self == *other.0
    }
}
