//! The providers this workspace ships. A runtime that is not built yet is not registered.

use std::collections::BTreeMap;

use crate::registry::Factory;

pub(crate) fn register_builtins(_map: &mut BTreeMap<String, Factory>) {}
