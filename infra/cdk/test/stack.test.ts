// The CDK stack's own checks: run by `bash infra/check.sh` (`npx tsx --test test/*.test.ts`).
import { test } from 'node:test';
import * as assert from 'node:assert/strict';
import { App } from 'aws-cdk-lib';
import { Template } from 'aws-cdk-lib/assertions';
import * as fs from 'node:fs';
import * as path from 'node:path';
import {
  STACK_SETTING_RANGES, TRIAGE_POLICY_DEFAULTS, TRIAGE_POLICY_RANGES, TriageStack, TriageStackProps,
} from '../lib/triage-stack';

const BASE: Omit<TriageStackProps, 'policy'> = {
  stackName: 'sqs-triage',
  functionTimeoutSeconds: 30,
  functionMemoryMb: 256,
  batchSize: 10,
  maxBatchingWindowSeconds: 0,
  maxConcurrency: 5,
  eventSourceScaling: 'MaximumConcurrency',
  minimumPollers: 2,
  maximumPollers: 200,
  maxReceiveCount: 1000,
  sourceRetentionSeconds: 345600,
  pointInTimeRecovery: true,
  alarmTopicArn: '',
  sourceAgeAlarmSeconds: 900,
  functionErrorsAlarmThreshold: 1,
  functionThrottlesAlarmThreshold: 1,
  storageFailuresAlarmThreshold: 1,
  breakerOpenedAlarmThreshold: 1,
};

let n = 0;
function stack(policy: Record<string, string> = {}, props: Partial<TriageStackProps> = {}): TriageStack {
  // No bundling: the tests synthesize without compiling the crate.
  const app = new App({ context: { 'aws:cdk:bundling-stacks': [] } });
  return new TriageStack(app, `S${n++}`, { ...BASE, ...props, policy: { ...TRIAGE_POLICY_DEFAULTS, ...policy } });
}

// Values src/config.rs refuses (Rust's `str::parse` of u32/u64/f64, then the range): the stack
// must refuse them at synthesis rather than deploy a function that cannot start.
const NOT_WHOLE = ['abc', '', ' ', 'NaN', 'Infinity', '2.5', '5.0', '1e1', '0x10', '0b1', '-0', '1_000', '5 5'];
const NOT_NUMBER = ['abc', '', 'NaN', 'Infinity', '-Infinity', '0x10', '2,5', '1_0'];

for (const [name, r] of Object.entries(TRIAGE_POLICY_RANGES)) {
  test(`${name}: refuses what the function refuses`, () => {
    for (const bad of r.whole ? NOT_WHOLE : NOT_NUMBER) {
      assert.throws(() => stack({ [name]: bad }), (e: Error) => e.message.startsWith(`${name}=`),
        `${name}=${JSON.stringify(bad)} was accepted`);
    }
    for (const outside of [r.min - (r.whole ? 1 : 0.01), r.max + (r.whole ? 1 : 0.01)]) {
      assert.throws(() => stack({ [name]: String(outside) }), (e: Error) => e.message.startsWith(`${name}=`),
        `${name}=${outside} was accepted`);
    }
  });
  test(`${name}: accepts its range's ends`, () => {
    for (const ok of [r.min, r.max]) {
      stack({ [name]: String(ok) });
    }
    if (!r.whole) {
      stack({ [name]: String(r.min + 0.5) });
    }
  });
}

test('every alarm notifies the SNS topic when one is given, none without', () => {
  const topic = 'arn:aws:sns:us-east-1:000000000000:ops';
  const withTopic = Template.fromStack(stack({}, { alarmTopicArn: topic })).findResources('AWS::CloudWatch::Alarm');
  assert.ok(Object.keys(withTopic).length >= 3, `alarms: ${Object.keys(withTopic)}`);
  for (const [id, a] of Object.entries(withTopic)) {
    assert.deepEqual(a.Properties.AlarmActions, [topic], `${id} actions`);
  }
  const without = Template.fromStack(stack()).findResources('AWS::CloudWatch::Alarm');
  for (const [id, a] of Object.entries(without)) {
    assert.equal(a.Properties.AlarmActions, undefined, `${id} actions`);
  }
});

test('an alarm on the function errors (AWS/Lambda Errors >= 1)', () => {
  const t = Template.fromStack(stack());
  const fns = Object.keys(t.findResources('AWS::Lambda::Function'));
  assert.equal(fns.length, 1);
  t.hasResourceProperties('AWS::CloudWatch::Alarm', {
    Namespace: 'AWS/Lambda',
    MetricName: 'Errors',
    Dimensions: [{ Name: 'FunctionName', Value: { Ref: fns[0] } }],
    Statistic: 'Sum',
    Threshold: 1,
    ComparisonOperator: 'GreaterThanOrEqualToThreshold',
  });
});

for (const [key, r] of Object.entries(STACK_SETTING_RANGES)) {
  test(`${key}: a whole number from ${r.min} to ${r.max}, as the SAM parameter`, () => {
    const policy = { TRIAGE_MAX_ATTEMPTS: '1' }; // leaves maxReceiveCount free down to 4
    for (const bad of [r.min - 1, r.max + 1, r.min + 0.5, Number.NaN]) {
      assert.throws(() => stack(policy, { [key]: bad }), (e: Error) => e.message.startsWith(`${key} (`),
        `${key}=${bad} was accepted`);
    }
    // The fewest receives, so the retention rule leaves room for either end of the range.
    const room = key === 'maxReceiveCount' ? {} : { maxReceiveCount: 4 };
    for (const ok of [r.min, r.max]) {
      stack(policy, { ...room, [key]: ok });
    }
  });
}

test('the other settings of infra/parity-settings.json synthesize', () => {
  const file = path.join(__dirname, '..', '..', 'parity-settings.json');
  const settings: { cdk: string; value: string }[] = JSON.parse(fs.readFileSync(file, 'utf8')).settings;
  const props: Record<string, unknown> = {};
  const policy: Record<string, string> = {};
  for (const s of settings) {
    if (s.cdk in TRIAGE_POLICY_RANGES) policy[s.cdk] = s.value;
    else if (s.cdk === 'pointInTimeRecovery') props[s.cdk] = s.value === 'true';
    else if (['alarmTopicArn', 'eventSourceScaling', 'applicationLogLevel'].includes(s.cdk)) props[s.cdk] = s.value;
    else props[s.cdk] = Number(s.value);
  }
  stack(policy, props as Partial<TriageStackProps>);
});

test('the mapping takes either maximum concurrency or provisioned pollers, never both, and reports event counts', () => {
  const byConcurrency = Template.fromStack(stack()).findResources('AWS::Lambda::EventSourceMapping');
  const [c] = Object.values(byConcurrency).map((r) => r.Properties);
  assert.deepEqual(c.ScalingConfig, { MaximumConcurrency: 5 });
  assert.equal(c.ProvisionedPollerConfig, undefined);
  assert.deepEqual(c.MetricsConfig, { Metrics: ['EventCount'] });
  const byPollers = Template.fromStack(stack({}, { eventSourceScaling: 'ProvisionedPollers', minimumPollers: 3, maximumPollers: 40 }))
    .findResources('AWS::Lambda::EventSourceMapping');
  const [p] = Object.values(byPollers).map((r) => r.Properties);
  assert.equal(p.ScalingConfig, undefined);
  assert.deepEqual(p.ProvisionedPollerConfig, { MinimumPollers: 3, MaximumPollers: 40 });
  assert.throws(() => stack({}, { eventSourceScaling: 'Both' as never }), /eventSourceScaling/);
  assert.throws(() => stack({}, { minimumPollers: 50, maximumPollers: 40 }), /minimumPollers/);
});

test('both queues take 1 MiB messages; one dashboard', () => {
  const t = Template.fromStack(stack());
  const queues = Object.values(t.findResources('AWS::SQS::Queue'));
  assert.equal(queues.length, 2);
  for (const q of queues) assert.equal(q.Properties.MaximumMessageSize, 1_048_576);
  assert.equal(Object.keys(t.findResources('AWS::CloudWatch::Dashboard')).length, 1);
});

test('queueType fifo: both queues FIFO with content-based deduplication off, names ending .fifo; no batching window', () => {
  const t = Template.fromStack(stack({}, { queueType: 'fifo' }));
  const queues = Object.values(t.findResources('AWS::SQS::Queue')).map((r) => r.Properties);
  assert.equal(queues.length, 2);
  for (const q of queues) {
    assert.equal(q.FifoQueue, true);
    assert.equal(q.ContentBasedDeduplication, false);
    assert.match(q.QueueName, /\.fifo$/);
  }
  const [m] = Object.values(t.findResources('AWS::Lambda::EventSourceMapping')).map((r) => r.Properties);
  assert.equal(m.MaximumBatchingWindowInSeconds, undefined);
  // Standard queues: no FIFO settings at all.
  for (const q of Object.values(Template.fromStack(stack()).findResources('AWS::SQS::Queue')).map((r) => r.Properties)) {
    assert.equal(q.FifoQueue, undefined);
    assert.equal(q.ContentBasedDeduplication, undefined);
  }
  assert.throws(() => stack({}, { queueType: 'fifo', batchSize: 11, maxBatchingWindowSeconds: 1 }), /FIFO/);
  assert.throws(() => stack({}, { queueType: 'fifo', maxBatchingWindowSeconds: 1 }), /FIFO/);
  assert.throws(() => stack({}, { queueType: 'lifo' as never }), /queueType/);
});

test('the function logs JSON at its application log level; Lambda platform lines from INFO', () => {
  const logging = (props: Partial<TriageStackProps>) => {
    const fns = Template.fromStack(stack({}, props)).findResources('AWS::Lambda::Function');
    return Object.values(fns)[0].Properties.LoggingConfig;
  };
  assert.deepEqual({ ...logging({}), LogGroup: undefined },
    { LogFormat: 'JSON', ApplicationLogLevel: 'INFO', SystemLogLevel: 'INFO', LogGroup: undefined });
  assert.equal(logging({ applicationLogLevel: 'ERROR' as never }).ApplicationLogLevel, 'ERROR');
  assert.throws(() => stack({}, { applicationLogLevel: 'LOUD' as never }), /applicationLogLevel/);
});
