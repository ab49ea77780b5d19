// The Node.js handler the layer's tests run through aws-lambda-ric and the extension: a plain
// SQS handler, with no sqs-triage code but the layer's helpers (`require('sqs-triage')`).
'use strict';

const fs = require('fs');
const { RetryAfter, Transient, job } = require('sqs-triage');

exports.handler = async (event, context) => {
  const failures = [];
  for (const r of event.Records) {
    const j = job(r);
    const payload = JSON.parse(r.body).payload;
    fs.appendFileSync(process.env.LAYER_TEST_LOG, JSON.stringify({
      message_id: r.messageId,
      records: event.Records.length,
      request_id: context.awsRequestId,
      remaining_ms: context.getRemainingTimeInMillis(),
      attempt: j.attempt,
      max_attempts: j.maxAttempts,
      job_id: j.id,
      job_type: j.type,
      action: payload.action,
    }) + '\n');
    switch (payload.action) {
      case 'ok':
        break;
      case 'type_error':
        // A bug in the code: reading a field of a missing value throws a TypeError.
        payload.order.lines.length;
        break;
      case 'transient':
        throw new Transient('later');
      case 'retry_after':
        throw new RetryAfter(payload.seconds, 'throttled');
      case 'partial':
        failures.push({ itemIdentifier: r.messageId });
        break;
      default:
        throw new Error(`unknown action ${payload.action}`);
    }
  }
  return { batchItemFailures: failures };
};
