import * as path from 'node:path';
import { CfnOutput, Stack, StackProps } from 'aws-cdk-lib';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { Construct } from 'constructs';
import { SqsTriage, SqsTriageSettings } from './sqs-triage';

// The construct, its settings and their checks, for the app and the tests that import them from here.
export * from './sqs-triage';

export interface TriageStackProps extends StackProps, SqsTriageSettings {
  /** Path of the Cargo.toml that holds the triage-lambda binary (default: this repository's). */
  readonly manifestPath?: string;
  /**
   * 'rust' (default): triage-lambda. 'python': the Python handler of examples/layer/python run
   * through the sqs-triage layer (the SAM template infra/template-python.yaml makes the same).
   */
  readonly runtime?: ReferenceRuntime;
  /** runtime 'python': the layer build's zip (default: .local/layer/sqs-triage-layer-arm64.zip). */
  readonly layerZip?: string;
  /** runtime 'python': TRIAGE_JOB_TYPES (default 'example.echo', the example handler's). */
  readonly jobTypes?: string;
}

/** The reference stack's function: triage-lambda, or the example Python handler through the layer. */
export const REFERENCE_RUNTIMES = ['rust', 'python'] as const;
export type ReferenceRuntime = typeof REFERENCE_RUNTIMES[number];

/**
 * The reference stack: one SqsTriage around `triage-lambda` (the built-in `triage.chaos` job
 * type), named after the stack, and its outputs. A team's own app uses SqsTriage with its own
 * crate instead (`triage init` writes one).
 */
export class TriageStack extends Stack {
  /** The stack's sqs-triage resources. */
  readonly triage: SqsTriage;

  constructor(scope: Construct, id: string, props: TriageStackProps) {
    super(scope, id, props);
    // The id 'Default' leaves the construct out of the logical IDs: they stay what they were
    // when the resources were the stack's own (a deployed stack updates in place).
    const runtime = props.runtime ?? 'rust';
    if (!(REFERENCE_RUNTIMES as readonly string[]).includes(runtime)) {
      throw new Error(`runtime (${runtime}) must be one of ${REFERENCE_RUNTIMES.join(', ')}`);
    }
    const root = path.join(__dirname, '..', '..', '..');
    const { manifestPath, layerZip, jobTypes, ...settings } = props;
    const triage = runtime === 'python'
      ? new SqsTriage(this, 'Default', {
        ...settings,
        layerHandler: {
          runtime: lambda.Runtime.PYTHON_3_13,
          handler: 'handler.handler',
          code: lambda.Code.fromAsset(path.join(root, 'examples', 'layer', 'python')),
          layerZip: layerZip ?? path.join(root, '.local', 'layer', 'sqs-triage-layer-arm64.zip'),
          jobTypes: jobTypes ?? 'example.echo',
        },
        functionDescription: 'sqs-triage reference function (Python, through the sqs-triage layer)',
      })
      : new SqsTriage(this, 'Default', {
        ...settings,
        manifestPath: manifestPath ?? path.join(root, 'Cargo.toml'),
        binaryName: 'triage-lambda',
        functionDescription: 'sqs-triage reference function (triage-lambda)',
      });
    this.triage = triage;

    new CfnOutput(this, 'QueueUrl', { value: triage.queue.queueUrl, description: 'URL of the source queue (send jobs here)' });
    new CfnOutput(this, 'QueueArn', { value: triage.queue.queueArn, description: 'ARN of the source queue' });
    new CfnOutput(this, 'DlqUrl', { value: triage.deadLetterQueue.queueUrl, description: 'URL of the dead-letter queue' });
    new CfnOutput(this, 'TableName', { value: triage.table.tableName, description: 'Name of the DynamoDB state table' });
    new CfnOutput(this, 'FunctionName', { value: triage.function.functionName, description: 'Name of the triage-lambda function' });
    new CfnOutput(this, 'DashboardName', { value: triage.dashboard.ref, description: 'Name of the CloudWatch dashboard' });
  }
}
