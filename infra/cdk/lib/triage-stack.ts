import * as path from 'node:path';
import {
  CfnOutput,
  Duration,
  RemovalPolicy,
  Stack,
  StackProps,
  Validations,
} from 'aws-cdk-lib';
import * as cloudwatch from 'aws-cdk-lib/aws-cloudwatch';
import * as cwActions from 'aws-cdk-lib/aws-cloudwatch-actions';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as logs from 'aws-cdk-lib/aws-logs';
import * as sns from 'aws-cdk-lib/aws-sns';
import * as sqs from 'aws-cdk-lib/aws-sqs';
import { RustFunction } from 'cargo-lambda-cdk';
import { Construct } from 'constructs';

/** The policy variables passed to triage-lambda, with the defaults of DESIGN.md. */
export const TRIAGE_POLICY_DEFAULTS: Record<string, string> = {
  TRIAGE_MAX_ATTEMPTS: '5',
  TRIAGE_BASE_DELAY_MS: '3000',
  TRIAGE_BACKOFF_MULTIPLIER: '2',
  TRIAGE_MAX_DELAY_MS: '3600000',
  TRIAGE_JITTER_MAX_MS: '1000',
  TRIAGE_BREAKER_THRESHOLD: '5',
  TRIAGE_BREAKER_WINDOW_S: '60',
  TRIAGE_BREAKER_OPEN_S: '30',
  TRIAGE_BREAKER_PROBES: '1',
};

/**
 * The accepted range of each policy variable: src/config.rs's, except TRIAGE_MAX_ATTEMPTS, which
 * the receive rule caps at 1000 / RECEIVES_PER_ATTEMPT (SQS's largest maxReceiveCount is 1000).
 * `bash infra/check.sh` compares this table with src/config.rs.
 */
export const TRIAGE_POLICY_RANGES: Record<string, [number, number]> = {
  TRIAGE_MAX_ATTEMPTS: [1, 250],
  TRIAGE_BASE_DELAY_MS: [0, 43_200_000],
  TRIAGE_BACKOFF_MULTIPLIER: [1, 100],
  TRIAGE_MAX_DELAY_MS: [1_000, 1_209_600_000],
  TRIAGE_JITTER_MAX_MS: [0, 3_600_000],
  TRIAGE_BREAKER_THRESHOLD: [1, 100_000],
  TRIAGE_BREAKER_WINDOW_S: [1, 86_400],
  TRIAGE_BREAKER_OPEN_S: [1, 43_200],
  TRIAGE_BREAKER_PROBES: [1, 100],
};

/** Variables the function reads as whole numbers (all but the multiplier). */
const FRACTIONAL_POLICY = new Set(['TRIAGE_BACKOFF_MULTIPLIER']);

/**
 * The receive rule (docs/deploy.md): maxReceiveCount >= RECEIVES_PER_ATTEMPT x TRIAGE_MAX_ATTEMPTS,
 * since deferrals (breaker open, early arrivals) count as receives. `triage setup` and the SAM
 * template's Rules apply the same factor.
 */
export const RECEIVES_PER_ATTEMPT = 4;

/** SQS's largest maxReceiveCount. */
const SQS_MAX_RECEIVE_COUNT = 1000;

export interface TriageStackProps extends StackProps {
  /** Lambda timeout; the source queue's visibility timeout is 6x this. */
  readonly functionTimeoutSeconds: number;
  readonly functionMemoryMb: number;
  readonly batchSize: number;
  readonly maxBatchingWindowSeconds: number;
  readonly maxConcurrency: number;
  /** Safety-net redrive: at least RECEIVES_PER_ATTEMPT x TRIAGE_MAX_ATTEMPTS (deferrals count as receives). */
  readonly maxReceiveCount: number;
  readonly sourceRetentionSeconds: number;
  readonly pointInTimeRecovery: boolean;
  /** Optional SNS topic for the alarms ('' = none). */
  readonly alarmTopicArn: string;
  /** TRIAGE_* policy variables. */
  readonly policy: Record<string, string>;
  /** Path of the Cargo.toml that holds the triage-lambda binary. */
  readonly manifestPath?: string;
}

/** Visibility timeout of an SQS event source: 6x the function timeout (AWS's recommendation). */
export const VISIBILITY_FACTOR = 6;

export class TriageStack extends Stack {
  constructor(scope: Construct, id: string, props: TriageStackProps) {
    super(scope, id, props);

    if (props.functionTimeoutSeconds * VISIBILITY_FACTOR > 43200) {
      throw new Error('functionTimeoutSeconds x 6 exceeds the 12 h SQS visibility timeout limit');
    }
    for (const [name, [lo, hi]] of Object.entries(TRIAGE_POLICY_RANGES)) {
      const raw = props.policy[name];
      const v = Number(raw);
      if (raw === undefined || raw.trim() === '' || !Number.isFinite(v) || v < lo || v > hi
          || (!FRACTIONAL_POLICY.has(name) && !Number.isInteger(v))) {
        throw new Error(`${name}=${JSON.stringify(raw)} is not valid: expected a ${FRACTIONAL_POLICY.has(name) ? 'number' : 'whole number'} from ${lo} to ${hi}`);
      }
    }
    if (!Number.isInteger(props.maxReceiveCount) || props.maxReceiveCount < 1
        || props.maxReceiveCount > SQS_MAX_RECEIVE_COUNT) {
      throw new Error(`maxReceiveCount (${props.maxReceiveCount}) must be a whole number from 1 to ${SQS_MAX_RECEIVE_COUNT}`);
    }
    const maxAttempts = Number(props.policy.TRIAGE_MAX_ATTEMPTS);
    if (props.maxReceiveCount < RECEIVES_PER_ATTEMPT * maxAttempts) {
      throw new Error(`maxReceiveCount (${props.maxReceiveCount}) leaves no room for TRIAGE_MAX_ATTEMPTS (${maxAttempts}): `
        + `it must be at least ${RECEIVES_PER_ATTEMPT} x ${maxAttempts} = ${RECEIVES_PER_ATTEMPT * maxAttempts}, since deferrals count as receives`);
    }

    const sourceQueueName = `${this.stackName}-jobs`;
    // Built from the name: referencing the source queue itself would be a dependency cycle,
    // since the source queue references the DLQ in its redrive policy.
    const sourceQueueArn = this.formatArn({ service: 'sqs', resource: sourceQueueName });

    // ------------------------------------------------------------- queues
    const dlq = new sqs.Queue(this, 'DeadLetterQueue', {
      queueName: `${this.stackName}-dlq`,
      retentionPeriod: Duration.days(14),
      encryption: sqs.QueueEncryption.SQS_MANAGED,
      enforceSSL: true,
      redriveAllowPolicy: {
        redrivePermission: sqs.RedrivePermission.BY_QUEUE,
        sourceQueues: [sqs.Queue.fromQueueArn(this, 'SourceQueueRef', sourceQueueArn)],
      },
    });

    const queue = new sqs.Queue(this, 'SourceQueue', {
      queueName: sourceQueueName,
      retentionPeriod: Duration.seconds(props.sourceRetentionSeconds),
      visibilityTimeout: Duration.seconds(props.functionTimeoutSeconds * VISIBILITY_FACTOR),
      encryption: sqs.QueueEncryption.SQS_MANAGED,
      enforceSSL: true,
      deadLetterQueue: { queue: dlq, maxReceiveCount: props.maxReceiveCount },
    });

    // ------------------------------------------------------------- state table
    const table = new dynamodb.Table(this, 'StateTable', {
      partitionKey: { name: 'pk', type: dynamodb.AttributeType.STRING },
      sortKey: { name: 'sk', type: dynamodb.AttributeType.STRING },
      billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
      timeToLiveAttribute: 'expires_at',
      pointInTimeRecoverySpecification: { pointInTimeRecoveryEnabled: props.pointInTimeRecovery },
      encryption: dynamodb.TableEncryption.AWS_MANAGED,
      // Attempt ledgers and breaker state expire by TTL; the SAM stack deletes the table too.
      removalPolicy: RemovalPolicy.DESTROY,
    });
    if (!props.pointInTimeRecovery) {
      Validations.of(table).acknowledge({
        id: 'AwsSolutions-DDB3',
        reason: 'Point-in-time recovery was turned off on purpose with -c pointInTimeRecovery=false.',
      });
    }

    // ------------------------------------------------------------- function
    const functionName = `${this.stackName}-triage-lambda`;
    const logGroup = new logs.LogGroup(this, 'FunctionLogGroup', {
      logGroupName: `/aws/lambda/${functionName}`,
      retention: logs.RetentionDays.ONE_MONTH,
      removalPolicy: RemovalPolicy.DESTROY,
    });

    // Least privilege: only the calls triage-lambda makes, only on this stack's resources.
    // Metrics are EMF log lines, so no cloudwatch:PutMetricData. No managed policies.
    // `bash infra/check.sh` derives the function's calls from the crate's source and fails on
    // any extra or missing action.
    const role = new iam.Role(this, 'TriageLambdaRole', {
      assumedBy: new iam.ServicePrincipal('lambda.amazonaws.com'),
      inlinePolicies: {
        'triage-lambda': new iam.PolicyDocument({
          statements: [
            new iam.PolicyStatement({
              sid: 'Logs',
              actions: ['logs:CreateLogStream', 'logs:PutLogEvents'],
              resources: [logGroup.logGroupArn],
            }),
            // ReceiveMessage, DeleteMessage, GetQueueAttributes: the event source mapping's (it
            // polls and deletes with this role); ChangeMessageVisibility: retries and deferrals;
            // GetQueueAttributes: the retention check at start-up too.
            new iam.PolicyStatement({
              sid: 'ConsumeSourceQueue',
              actions: [
                'sqs:ReceiveMessage',
                'sqs:DeleteMessage',
                'sqs:ChangeMessageVisibility',
                'sqs:GetQueueAttributes',
              ],
              resources: [queue.queueArn],
            }),
            // Dead-lettered copies (SendMessageBatch); the DLQ's size limit at start-up.
            new iam.PolicyStatement({
              sid: 'SendToDeadLetterQueue',
              actions: ['sqs:SendMessage', 'sqs:GetQueueAttributes'],
              resources: [dlq.queueArn],
            }),
            // Attempt ledger: BatchGetItem (reads), UpdateItem (counts), BatchWriteItem (cleanup).
            // Breakers: GetItem (reads), UpdateItem (failure counts), PutItem (transitions).
            new iam.PolicyStatement({
              sid: 'StateTable',
              actions: [
                'dynamodb:GetItem',
                'dynamodb:BatchGetItem',
                'dynamodb:PutItem',
                'dynamodb:UpdateItem',
                'dynamodb:BatchWriteItem',
              ],
              resources: [table.tableArn],
            }),
          ],
        }),
      },
    });

    const fn = new RustFunction(this, 'TriageLambda', {
      manifestPath: props.manifestPath ?? path.join(__dirname, '..', '..', '..', 'Cargo.toml'),
      binaryName: 'triage-lambda',
      runtime: 'provided.al2023',
      architecture: lambda.Architecture.ARM_64,
      functionName,
      description: 'sqs-triage reference function (triage-lambda)',
      memorySize: props.functionMemoryMb,
      timeout: Duration.seconds(props.functionTimeoutSeconds),
      role,
      logGroup,
      loggingFormat: lambda.LoggingFormat.TEXT,
      environment: {
        RUST_LOG: 'info',
        TRIAGE_QUEUE_URL: queue.queueUrl,
        TRIAGE_DLQ_URL: dlq.queueUrl,
        TRIAGE_TABLE: table.tableName,
        ...props.policy,
      },
    });
    // The role must hold the SQS permissions before the mapping is created.
    fn.node.addDependency(role);

    // A plain mapping: SqsEventSource would also grant sqs:GetQueueUrl through queue.grantConsumeMessages.
    fn.addEventSourceMapping('SqsSource', {
      eventSourceArn: queue.queueArn,
      batchSize: props.batchSize,
      maxBatchingWindow: props.maxBatchingWindowSeconds > 0
        ? Duration.seconds(props.maxBatchingWindowSeconds)
        : undefined,
      maxConcurrency: props.maxConcurrency,
      reportBatchItemFailures: true,
      enabled: true,
    });

    // ------------------------------------------------------------- alarms
    const dlqAlarm = new cloudwatch.Alarm(this, 'DlqDepthAlarm', {
      alarmDescription: 'Messages are waiting in the sqs-triage dead-letter queue.',
      metric: dlq.metricApproximateNumberOfMessagesVisible({
        period: Duration.minutes(1),
        statistic: cloudwatch.Stats.MAXIMUM,
      }),
      threshold: 1,
      evaluationPeriods: 1,
      comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
      treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
    });
    const breakerAlarm = new cloudwatch.Alarm(this, 'BreakerOpenedAlarm', {
      alarmDescription: 'A circuit breaker opened for some job type (EMF metric SqsTriage/BreakerOpened, all job types).',
      metric: new cloudwatch.Metric({
        namespace: 'SqsTriage',
        metricName: 'BreakerOpened',
        statistic: cloudwatch.Stats.SUM,
        period: Duration.minutes(1),
      }),
      threshold: 1,
      evaluationPeriods: 1,
      comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
      treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
    });
    if (props.alarmTopicArn) {
      const topic = sns.Topic.fromTopicArn(this, 'AlarmTopic', props.alarmTopicArn);
      dlqAlarm.addAlarmAction(new cwActions.SnsAction(topic));
      breakerAlarm.addAlarmAction(new cwActions.SnsAction(topic));
    }

    // ------------------------------------------------------------- outputs
    new CfnOutput(this, 'QueueUrl', { value: queue.queueUrl, description: 'URL of the source queue (send jobs here)' });
    new CfnOutput(this, 'QueueArn', { value: queue.queueArn, description: 'ARN of the source queue' });
    new CfnOutput(this, 'DlqUrl', { value: dlq.queueUrl, description: 'URL of the dead-letter queue' });
    new CfnOutput(this, 'TableName', { value: table.tableName, description: 'Name of the DynamoDB state table' });
    new CfnOutput(this, 'FunctionName', { value: fn.functionName, description: 'Name of the triage-lambda function' });
  }
}
