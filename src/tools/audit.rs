//! The audit trail of tool calls (`tool_calls` table) and the compact log kept with the reply.
//!
//! The audit row is also the tool step of the turn journal: a retried turn takes a call's recorded
//! result instead of running the tool again ([`recorded`]).

use serde_json::{Value, json};
use sqlx::Row;

use super::{ToolContext, ToolError, ToolOutput, ToolResult, clip};
use crate::store::StoreError;

/// Longest argument text kept in the audit table.
const MAX_AUDIT_ARGS: usize = 4000;

/// Records one executed call; a repeat of the same (message, call id) is ignored.
pub async fn record(
    ctx: &ToolContext,
    round: u32,
    raw_args: &str,
    result: &ToolResult,
    duration_ms: u64,
) -> Result<(), StoreError> {
    let stored = match &result.outcome {
        Ok(o) => json!({ "data": o.data, "card": o.card }),
        Err(e) => e.to_model(),
    };
    let card_type = result
        .card()
        .and_then(|c| c.get("type"))
        .and_then(Value::as_str);
    sqlx::query(
        "INSERT INTO tool_calls
            (message_id, tool_call_id, round, user_id, bot_id, tool, arguments, ok, result, card_type, duration_ms)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
         ON CONFLICT (message_id, tool_call_id) DO NOTHING",
    )
    .bind(ctx.message_id.to_hex())
    .bind(&ctx.tool_call_id)
    .bind(round as i32)
    .bind(ctx.user.to_hex())
    .bind(ctx.bot.to_hex())
    .bind(&result.name)
    .bind(clip(raw_args, MAX_AUDIT_ARGS))
    .bind(result.is_ok())
    .bind(stored)
    .bind(card_type)
    .bind(duration_ms.min(i32::MAX as u64) as i32)
    .execute(&ctx.pg.pool)
    .await?;
    Ok(())
}

/// The result an earlier attempt of this turn recorded for this call (`ctx.tool_call_id`), if any, and
/// only if it was the same call (tool and arguments): a forced replay may reuse a call id for another.
pub async fn recorded(
    ctx: &ToolContext,
    tool: &str,
    raw_args: &str,
) -> Result<Option<ToolResult>, StoreError> {
    let row = sqlx::query(
        "SELECT tool, ok, result FROM tool_calls
         WHERE message_id = $1 AND tool_call_id = $2 AND tool = $3 AND arguments = $4",
    )
    .bind(ctx.message_id.to_hex())
    .bind(&ctx.tool_call_id)
    .bind(tool)
    .bind(clip(raw_args, MAX_AUDIT_ARGS))
    .fetch_optional(&ctx.pg.pool)
    .await?;
    Ok(row.map(|r| {
        let result: Value = r.get("result");
        let outcome = if r.get::<bool, _>("ok") {
            Ok(ToolOutput {
                data: result["data"].clone(),
                card: Some(result["card"].clone()).filter(|c| !c.is_null()),
            })
        } else {
            Err(ToolError::Recorded {
                message: result["error"].as_str().unwrap_or("error").to_owned(),
                model: result,
            })
        };
        ToolResult {
            name: r.get("tool"),
            outcome,
        }
    }))
}

/// The compact form of one call, kept on the assistant's history row (`bot_conversations.tool_calls`).
pub fn compact(result: &ToolResult, raw_args: &str) -> Value {
    let args: Value = serde_json::from_str(raw_args).unwrap_or_else(|_| json!(clip(raw_args, 200)));
    let mut v = json!({ "tool": result.name, "args": args, "ok": result.is_ok() });
    match &result.outcome {
        Ok(o) => {
            for key in ["_id", "name", "count", "status"] {
                if let Some(x) = o.data.get(key) {
                    v[key] = x.clone();
                }
            }
            if let Some(t) = o.card.as_ref().and_then(|c| c.get("type")) {
                v["card"] = t.clone();
            }
        }
        Err(e) => v["error"] = json!(clip(&e.to_string(), 200)),
    }
    v
}
