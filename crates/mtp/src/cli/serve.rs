//! `mtp serve`: the loaded provider behind the OpenAI-compatible server of `mtp-server`.

use crate::cli::args::ServeArgs;
use crate::cli::error::CliError;
use crate::cli::open_provider_with;
use crate::cli::output::Out;

pub(crate) async fn run(a: ServeArgs, out: &mut Out) -> Result<(), CliError> {
    let kind = mtp_contract::ProviderKind::from_name(&a.model.provider);
    let native = kind.is_some_and(|k| k.is_native());
    let http = crate::cli::is_http(&a.model.provider);
    if !native && !http && a.max_batch > 1 {
        return Err(CliError::InvalidFlag {
            flag: "--max-batch",
            message: format!(
                "the in-process `{}` runtime generates one sequence at a time; requests beyond \
                 the first wait in the queue (--max-queue)",
                a.model.provider
            ),
        });
    }
    if !native && a.parse_special {
        return Err(CliError::InvalidFlag {
            flag: "--parse-special",
            message: format!(
                "it sets how the native engine tokenizes client text; `{}` tokenizes on its own",
                a.model.provider
            ),
        });
    }
    if !native && a.cache_dir.is_some() {
        return Err(CliError::InvalidFlag {
            flag: "--cache-dir",
            message: format!(
                "the prefix cache on disk is the native engine's; `{}` keeps its own cache",
                a.model.provider
            ),
        });
    }
    let mut native_opts = crate::native::NativeOptions::default();
    if native {
        // the native engine batches the sequences in flight (continuous batching)
        if a.max_batch > 1 {
            native_opts.max_batch = Some(a.max_batch as usize);
        }
        native_opts.prefill_chunk = Some(a.prefill_chunk as usize);
        native_opts.parse_special = a.parse_special;
        native_opts.prompt_cache_bytes = usize::try_from(a.cache_bytes).unwrap_or(usize::MAX);
        if let Some(dir) = &a.cache_dir {
            native_opts.prompt_cache_dir = Some(dir.clone());
            native_opts.prompt_cache_disk_bytes = a.cache_disk_bytes;
        }
    }
    // the key protects this server; it is not the upstream runtime's
    let mut model_args = a.model.clone();
    let api_key = model_args.api_key.take();
    let (llm, model) = open_provider_with(&model_args, out, native_opts).await?;
    let status = llm.speculation_status();
    let lane = if status.lane_loaded {
        format!(
            "MTP lane loaded ({}, depth {})",
            status.drafter.as_deref().unwrap_or("embedded"),
            status
                .depth_phrase()
                .unwrap_or_else(|| "server default".into())
        )
    } else {
        format!(
            "no MTP lane{}",
            status.reason.map(|r| format!(" ({r})")).unwrap_or_default()
        )
    };
    let addr = if a.host.contains(':') && !a.host.starts_with('[') {
        format!("[{}]:{}", a.host, a.port)
    } else {
        format!("{}:{}", a.host, a.port)
    };
    let mut config = mtp_server::ServerConfig::new(addr.clone());
    config.api_key = api_key;
    config.max_batch = a.max_batch as usize;
    config.max_queue = a.max_queue as usize;
    config.max_body_bytes = usize::try_from(a.max_body_bytes).unwrap_or(usize::MAX);
    config.model_id = Some(a.served_model_name.clone().unwrap_or(model.clone()));
    config.max_connections = a.max_connections;
    config.header_timeout = std::time::Duration::from_secs_f64(a.header_timeout);
    config.body_timeout = std::time::Duration::from_secs_f64(a.body_timeout);
    config.write_timeout = std::time::Duration::from_secs_f64(a.write_timeout);
    config.shutdown_grace = std::time::Duration::from_secs_f64(a.shutdown_grace);
    config.limits = mtp_server::openai::Limits {
        max_stop: a.max_stop,
        max_stop_bytes: a.max_stop_bytes,
        max_messages: a.max_messages,
        max_content_parts: a.max_content_parts,
        max_tools: a.max_tools,
        max_prompt_bytes: a.max_prompt_bytes,
        max_choices: a.max_choices,
    };
    config.default_max_tokens = a.default_max_tokens;
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| mtp_server::ServerError::Bind {
            addr: addr.clone(),
            source,
        })?;
    let bound = listener.local_addr().map_err(CliError::Io)?;
    let shutdown = mtp_server::shutdown_signal();
    out.line(&format!(
        "serving {model} ({}; {lane}) on http://{bound}/v1 — POST /v1/chat/completions, \
         /v1/completions, /v1/responses, /v1/messages; GET /v1/models, /health, /metrics{}",
        a.model.provider,
        if config.api_key.is_some() {
            "; bearer key required"
        } else {
            ""
        }
    ))?;
    mtp_server::serve_on(listener, llm, config, shutdown).await?;
    out.line("stopped")?;
    Ok(())
}
