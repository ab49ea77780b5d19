#!/usr/bin/env node
import { App, Validations } from 'aws-cdk-lib';
import { ApplicationLogLevel } from 'aws-cdk-lib/aws-lambda';
import { AwsSolutionsChecks } from 'cdk-nag';
import { EventSourceScaling, QueueType, ReferenceRuntime, TRIAGE_POLICY_DEFAULTS, TriageStack } from '../lib/triage-stack';

const app = new App();

// `-c skipBundling=true`: synthesize without compiling the Rust crate (CI, offline checks). The
// CLI refuses `-c aws:cdk:bundling-stacks=[]`, so the app sets that context itself. The function's
// asset then points at the crate's source folder; deploy without this flag.
if (String(app.node.tryGetContext('skipBundling')) === 'true') {
  app.node.setContext('aws:cdk:bundling-stacks', []);
}

/** A context value (cdk.json or `-c key=value`), which the CLI passes as a string. */
function ctx(key: string, fallback: string): string {
  const v = app.node.tryGetContext(key);
  return v === undefined || v === null ? fallback : String(v);
}
function num(key: string, fallback: number): number {
  const v = Number(ctx(key, String(fallback)));
  if (!Number.isFinite(v)) throw new Error(`context ${key} must be a number`);
  return v;
}

const policy: Record<string, string> = {};
for (const [name, fallback] of Object.entries(TRIAGE_POLICY_DEFAULTS)) {
  policy[name] = ctx(name, fallback);
}

new TriageStack(app, 'SqsTriage', {
  stackName: ctx('stackName', 'sqs-triage'),
  description: 'sqs-triage: triage-lambda behind an SQS queue, its DLQ, the DynamoDB state table, alarms and a dashboard',
  env: {
    account: process.env.CDK_DEFAULT_ACCOUNT,
    region: process.env.CDK_DEFAULT_REGION,
  },
  functionTimeoutSeconds: num('functionTimeoutSeconds', 30),
  functionMemoryMb: num('functionMemoryMb', 256),
  batchSize: num('batchSize', 10),
  maxBatchingWindowSeconds: num('maxBatchingWindowSeconds', 0),
  maxConcurrency: num('maxConcurrency', 5),
  eventSourceScaling: ctx('eventSourceScaling', 'MaximumConcurrency') as EventSourceScaling,
  minimumPollers: num('minimumPollers', 2),
  maximumPollers: num('maximumPollers', 200),
  queueType: ctx('queueType', 'standard') as QueueType,
  maxReceiveCount: num('maxReceiveCount', 100),
  sourceRetentionSeconds: num('sourceRetentionSeconds', 864000),
  pointInTimeRecovery: ctx('pointInTimeRecovery', 'true') !== 'false',
  applicationLogLevel: ctx('applicationLogLevel', 'INFO') as ApplicationLogLevel,
  alarmTopicArn: ctx('alarmTopicArn', ''),
  sourceAgeAlarmSeconds: num('sourceAgeAlarmSeconds', 900),
  functionErrorsAlarmThreshold: num('functionErrorsAlarmThreshold', 1),
  functionThrottlesAlarmThreshold: num('functionThrottlesAlarmThreshold', 1),
  storageFailuresAlarmThreshold: num('storageFailuresAlarmThreshold', 1),
  breakerOpenedAlarmThreshold: num('breakerOpenedAlarmThreshold', 1),
  policy,
  // `-c runtime=python`: the example Python handler through the layer (infra/template-python.yaml).
  runtime: ctx('runtime', 'rust') as ReferenceRuntime,
  layerZip: app.node.tryGetContext('layerZip'),
  jobTypes: app.node.tryGetContext('jobTypes'),
});

// cdk-nag 3: AWS Solutions rules run as a policy validation plugin; an unacknowledged error fails synth.
Validations.of(app).addPlugins(new AwsSolutionsChecks(app));
