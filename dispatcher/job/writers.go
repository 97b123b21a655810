package job

import (
	batchv1 "k8s.io/api/batch/v1"
)

// IsNamedFor tells whether Job j is named for the task taskID: its name,
// which never changes, is Name(taskID), as Build made it.
//
// A Job's name never changes, and its runwarden.dev/ labels and
// annotations are the dispatcher's alone to change where the chart's
// writers policy is installed (templates/writers-policy.yaml). Without that
// policy, whoever may patch Jobs could rewrite contract.TaskID of task
// t-1's finished Job to t-2, and a source that believed it would report t-2
// with t-1's outcome and record: a source takes a Job's annotation for its
// task only when the Job's name agrees with it.
func IsNamedFor(j *batchv1.Job, taskID string) bool {
	return taskID != "" && j.Name == Name(taskID)
}
