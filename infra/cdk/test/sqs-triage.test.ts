// The SqsTriage construct as a team's own app uses it: run by `bash infra/check.sh`.
import { test } from 'node:test';
import * as assert from 'node:assert/strict';
import { App, Stack } from 'aws-cdk-lib';
import { Template } from 'aws-cdk-lib/assertions';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import {
  LAYER_WRAPPER, LayerHandler, SQS_TRIAGE_DEFAULTS, SqsTriage, SqsTriageProps, TRIAGE_POLICY_DEFAULTS,
} from '../lib/sqs-triage';

const MANIFEST = path.join(__dirname, '..', '..', '..', 'Cargo.toml');

let n = 0;
function app(): App {
  // No bundling: the tests synthesize without compiling the crate.
  return new App({ context: { 'aws:cdk:bundling-stacks': [] } });
}
function oneStack(props: Partial<SqsTriageProps> = {}): Stack {
  const stack = new Stack(app(), `C${n++}`, { stackName: 'team' });
  new SqsTriage(stack, 'Jobs', { manifestPath: MANIFEST, binaryName: 'triage-lambda', ...props });
  return stack;
}

/** The logical ID of the one resource of `type` whose `prop` is `value`. */
function idWhere(t: Template, type: string, prop: string, value: unknown): string {
  const ids = Object.entries(t.findResources(type)).filter(([, r]) => r.Properties[prop] === value).map(([id]) => id);
  assert.equal(ids.length, 1, `${type} with ${prop}=${JSON.stringify(value)}: ${ids}`);
  return ids[0];
}

test('used twice in one stack with different prefixes: two of everything, each wired to its own', () => {
  const stack = new Stack(app(), `C${n++}`, { stackName: 'team' });
  const orders = new SqsTriage(stack, 'Orders', { manifestPath: MANIFEST, binaryName: 'orders', namePrefix: 'orders' });
  const emails = new SqsTriage(stack, 'Emails', {
    manifestPath: MANIFEST, binaryName: 'emails', namePrefix: 'emails', queueType: 'fifo', policy: { TRIAGE_MAX_ATTEMPTS: '3' },
  });
  const t = Template.fromStack(stack);
  const count = (type: string) => Object.keys(t.findResources(type)).length;
  assert.equal(count('AWS::SQS::Queue'), 4);
  assert.equal(count('AWS::DynamoDB::Table'), 2);
  assert.equal(count('AWS::Lambda::Function'), 2);
  assert.equal(count('AWS::Lambda::EventSourceMapping'), 2);
  assert.equal(count('AWS::Logs::LogGroup'), 2);
  assert.equal(count('AWS::IAM::Role'), 2);
  assert.equal(count('AWS::CloudWatch::Alarm'), 14);
  assert.equal(count('AWS::CloudWatch::Dashboard'), 2);
  assert.equal(orders.alarms.length + emails.alarms.length, 14);

  for (const [prefix, suffix, attempts] of [['orders', '', '5'], ['emails', '.fifo', '3']]) {
    const source = idWhere(t, 'AWS::SQS::Queue', 'QueueName', `${prefix}-jobs${suffix}`);
    const dlq = idWhere(t, 'AWS::SQS::Queue', 'QueueName', `${prefix}-dlq${suffix}`);
    const fn = idWhere(t, 'AWS::Lambda::Function', 'FunctionName', `${prefix}-triage-lambda`);
    idWhere(t, 'AWS::Logs::LogGroup', 'LogGroupName', `/aws/lambda/${prefix}-triage-lambda`);
    idWhere(t, 'AWS::CloudWatch::Dashboard', 'DashboardName', `${prefix}-triage`);
    const f = t.findResources('AWS::Lambda::Function')[fn].Properties;
    assert.deepEqual(f.Environment.Variables.TRIAGE_QUEUE_URL, { Ref: source }, `${prefix} queue`);
    assert.deepEqual(f.Environment.Variables.TRIAGE_DLQ_URL, { Ref: dlq }, `${prefix} DLQ`);
    assert.equal(f.Environment.Variables.TRIAGE_MAX_ATTEMPTS, attempts, `${prefix} attempts`);
    // Its role reaches its own queues and table only.
    const role = f.Role['Fn::GetAtt'][0];
    const text = JSON.stringify(t.findResources('AWS::IAM::Role')[role]);
    assert.ok(text.includes(source) && text.includes(dlq), `${prefix} role: ${text}`);
    const mapping = Object.values(t.findResources('AWS::Lambda::EventSourceMapping'))
      .find((m) => m.Properties.FunctionName.Ref === fn);
    assert.deepEqual(mapping?.Properties.EventSourceArn, { 'Fn::GetAtt': [source, 'Arn'] });
  }
  const other = (name: string) => JSON.stringify(t.findResources('AWS::IAM::Role')[
    t.findResources('AWS::Lambda::Function')[idWhere(t, 'AWS::Lambda::Function', 'FunctionName', name)].Properties.Role['Fn::GetAtt'][0]]);
  assert.ok(!other('orders-triage-lambda').includes(idWhere(t, 'AWS::SQS::Queue', 'QueueName', 'emails-jobs.fifo')));
});

test('the same prefix twice in one stack is refused at synthesis', () => {
  const stack = new Stack(app(), `C${n++}`, { stackName: 'team' });
  new SqsTriage(stack, 'A', { manifestPath: MANIFEST, binaryName: 'a' });
  // Without namePrefix both would take the stack's name, and make the same queue names.
  assert.throws(() => new SqsTriage(stack, 'B', { manifestPath: MANIFEST, binaryName: 'b' }),
    /namePrefix "team" is already used by another SqsTriage/);
  assert.throws(() => new SqsTriage(stack, 'C', { manifestPath: MANIFEST, binaryName: 'c', namePrefix: 'team' }), /already used/);
  new SqsTriage(stack, 'D', { manifestPath: MANIFEST, binaryName: 'd', namePrefix: 'other' });
});

test('defaults: the stack name as prefix, SQS_TRIAGE_DEFAULTS, and they equal infra/cdk/cdk.json', () => {
  const t = Template.fromStack(oneStack());
  idWhere(t, 'AWS::SQS::Queue', 'QueueName', 'team-jobs');
  const f = Object.values(t.findResources('AWS::Lambda::Function'))[0].Properties;
  assert.equal(f.Timeout, SQS_TRIAGE_DEFAULTS.functionTimeoutSeconds);
  assert.equal(f.MemorySize, SQS_TRIAGE_DEFAULTS.functionMemoryMb);
  assert.equal(f.Description, 'sqs-triage function (triage-lambda)');
  for (const [k, v] of Object.entries(TRIAGE_POLICY_DEFAULTS)) assert.equal(f.Environment.Variables[k], v, k);

  const context = JSON.parse(fs.readFileSync(path.join(__dirname, '..', 'cdk.json'), 'utf8')).context;
  for (const [key, value] of Object.entries(SQS_TRIAGE_DEFAULTS)) {
    if (key === 'policy') {
      for (const [k, v] of Object.entries(value as Record<string, string>)) assert.equal(String(context[k]), v, k);
    } else if (key === 'applicationLogLevel') {
      assert.equal(value, 'INFO'); // cdk.json leaves it to bin/app.ts's fallback, INFO
    } else {
      assert.equal(String(context[key]), String(value), key);
    }
  }
});

test('a partial policy keeps the other defaults; settings keep their validation', () => {
  const f = Object.values(Template.fromStack(oneStack({ policy: { TRIAGE_MAX_ATTEMPTS: '8' } }))
    .findResources('AWS::Lambda::Function'))[0].Properties.Environment.Variables;
  assert.equal(f.TRIAGE_MAX_ATTEMPTS, '8');
  assert.equal(f.TRIAGE_BASE_DELAY_MS, TRIAGE_POLICY_DEFAULTS.TRIAGE_BASE_DELAY_MS);
  assert.throws(() => oneStack({ policy: { TRIAGE_MAX_ATTEMPTS: '5.0' } }), /TRIAGE_MAX_ATTEMPTS=/);
  assert.throws(() => oneStack({ policy: { TRIAGE_MAX_ATTEMPTS: '30' } }), /maxReceiveCount \(100\) leaves no room/);
  assert.throws(() => oneStack({ batchSize: 0 }), /batchSize \(0\)/);
  assert.throws(() => oneStack({ namePrefix: 'has space' }), /namePrefix/);
  assert.throws(() => oneStack({ namePrefix: 'x'.repeat(51) }), /namePrefix/);
  oneStack({ namePrefix: 'x'.repeat(50) });
  assert.throws(() => oneStack({ binaryName: '' }), /binaryName/);
  assert.throws(() => oneStack({ manifestPath: '' }), /manifestPath/);
});

test('a redrive that retention outruns is refused: the retention rule', () => {
  // 100 receives of 5400 s (a 900 s function) over 4 days: retention would delete the message first.
  assert.throws(() => oneStack({ functionTimeoutSeconds: 900, sourceRetentionSeconds: 345600 }),
    /maxReceiveCount \(100\) x the visibility timeout \(5400 s.*at most 48/);
  oneStack({ functionTimeoutSeconds: 900, sourceRetentionSeconds: 345600, maxReceiveCount: 48 });
  // The defaults hold it for every function timeout.
  oneStack({ functionTimeoutSeconds: 900 });
  // At most 13 days: the DLQ (14 days) keeps what SQS moves into it a day longer.
  assert.throws(() => oneStack({ sourceRetentionSeconds: 1_123_201 }), /sourceRetentionSeconds/);
});

/** A stand-in for the layer build's zip (an empty archive: synthesis only stages it). */
function layerZip(arch = 'arm64'): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sqs-triage-layer-'));
  const zip = path.join(dir, `sqs-triage-layer-${arch}.zip`);
  fs.writeFileSync(zip, Buffer.from([0x50, 0x4b, 0x05, 0x06, ...new Array(18).fill(0)]));
  return zip;
}
function layered(props: Partial<LayerHandler> = {}, more: Partial<SqsTriageProps> = {}): Stack {
  const stack = new Stack(app(), `C${n++}`, { stackName: 'team' });
  new SqsTriage(stack, 'Jobs', {
    layerHandler: {
      runtime: lambda.Runtime.PYTHON_3_13,
      handler: 'handler.handler',
      code: lambda.Code.fromAsset(path.join(__dirname, '..', '..', '..', 'examples', 'layer', 'python')),
      layerZip: layerZip(),
      jobTypes: 'orders.charge,orders.refund',
      ...props,
    },
    ...more,
  });
  return stack;
}

test('a layer handler: the function gets the layer, the wrapper, its job types, the role and the mapping', () => {
  const t = Template.fromStack(layered());
  const layers = t.findResources('AWS::Lambda::LayerVersion');
  assert.equal(Object.keys(layers).length, 1);
  const [layerId, layer] = Object.entries(layers)[0];
  assert.deepEqual(layer.Properties.CompatibleArchitectures, ['arm64']);
  assert.deepEqual(layer.Properties.CompatibleRuntimes, ['python3.13']);
  assert.equal(layer.Properties.LayerName, 'team-sqs-triage');
  assert.equal(layer.DeletionPolicy, 'Delete');
  const [fnId, fn] = Object.entries(t.findResources('AWS::Lambda::Function'))[0];
  assert.equal(fn.Properties.Runtime, 'python3.13');
  assert.equal(fn.Properties.Handler, 'handler.handler');
  assert.deepEqual(fn.Properties.Layers, [{ Ref: layerId }]);
  assert.equal(fn.Properties.Environment.Variables.AWS_LAMBDA_EXEC_WRAPPER, LAYER_WRAPPER);
  assert.equal(fn.Properties.Environment.Variables.TRIAGE_JOB_TYPES, 'orders.charge,orders.refund');
  assert.equal(fn.Properties.Environment.Variables.TRIAGE_MAX_ATTEMPTS, TRIAGE_POLICY_DEFAULTS.TRIAGE_MAX_ATTEMPTS);
  const mapping = Object.values(t.findResources('AWS::Lambda::EventSourceMapping'))[0];
  assert.deepEqual(mapping.Properties.FunctionName, { Ref: fnId });
  assert.deepEqual(mapping.Properties.FunctionResponseTypes, ['ReportBatchItemFailures']);
  const role = JSON.stringify(t.findResources('AWS::IAM::Role')[fn.Properties.Role['Fn::GetAtt'][0]]);
  assert.ok(role.includes('sqs:ChangeMessageVisibility') && role.includes('dynamodb:PartiQLUpdate'), role);
  // x86_64 takes the x86_64 build.
  const x86 = Template.fromStack(layered({ architecture: lambda.Architecture.X86_64, layerZip: layerZip('x86_64') }));
  assert.deepEqual(Object.values(x86.findResources('AWS::Lambda::LayerVersion'))[0].Properties.CompatibleArchitectures, ['x86_64']);
  assert.deepEqual(Object.values(x86.findResources('AWS::Lambda::Function'))[0].Properties.Architectures, ['x86_64']);
});

test('a layer handler is refused with the other architecture\'s zip, no job types, or a crate as well', () => {
  assert.throws(() => layered({ layerZip: layerZip('x86_64') }), /is the x86_64 build, but the function runs on arm64/);
  assert.throws(() => layered({ jobTypes: '' }), /jobTypes/);
  assert.throws(() => layered({ jobTypes: 'a, b' }), /jobTypes/);
  // The extension refuses a job type over 256 characters at start-up: refused here first.
  assert.throws(() => layered({ jobTypes: `a,${'x'.repeat(257)}` }), /1 to 256 characters/);
  layered({ jobTypes: 'x'.repeat(256) });
  assert.throws(() => layered({ layerZip: '/tmp/layer.tar' }), /layerZip/);
  assert.throws(() => layered({}, { manifestPath: MANIFEST, binaryName: 'x' }), /either layerHandler .* or manifestPath/);
});
