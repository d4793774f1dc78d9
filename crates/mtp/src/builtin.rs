//! The providers this workspace ships. A runtime that is not built yet is not registered.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::registry::Factory;

pub(crate) fn register_builtins(map: &mut BTreeMap<String, Factory>) {
    // The native engine; `mlx` accepts the same MLX-layout checkpoints (the report's `runtime`
    // always names what really ran, e.g. `candle-cpu`).
    for name in ["native", "mlx"] {
        map.insert(
            name.to_string(),
            Arc::new(move |model: &str, opts: &mtp_contract::ProviderOptions| {
                crate::native::create(name, model, opts)
            }),
        );
    }
    for &name in mtp_runtimes::PROVIDERS {
        map.insert(
            name.to_string(),
            Arc::new(move |model: &str, opts: &mtp_contract::ProviderOptions| {
                mtp_runtimes::create(name, model, opts)
            }),
        );
    }
}
