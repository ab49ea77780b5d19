import * as path from 'node:path';
import { CfnOutput, Stack, StackProps } from 'aws-cdk-lib';
import { Construct } from 'constructs';
import { SqsTriage, SqsTriageSettings } from './sqs-triage';

// The construct, its settings and their checks, for the app and the tests that import them from here.
export * from './sqs-triage';

export interface TriageStackProps extends StackProps, SqsTriageSettings {
  /** Path of the Cargo.toml that holds the triage-lambda binary (default: this repository's). */
  readonly manifestPath?: string;
}

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
    const triage = new SqsTriage(this, 'Default', {
      ...props,
      manifestPath: props.manifestPath ?? path.join(__dirname, '..', '..', '..', 'Cargo.toml'),
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
