package testcluster

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestUntil(t *testing.T) {
	ctx := context.Background()
	n := 0
	took, ok, err := Until(ctx, time.Minute, func() (bool, error) { n++; return n == 3, nil })
	if !ok || err != nil || n != 3 || took < 400*time.Millisecond {
		t.Errorf("done on the third call: %v %v %v after %d calls", took, ok, err, n)
	}
	_, ok, err = Until(ctx, 300*time.Millisecond, func() (bool, error) { return false, nil })
	if ok || err != nil {
		t.Errorf("never done: %v %v", ok, err)
	}
	boom := errors.New("boom")
	if _, _, err := Until(ctx, time.Minute, func() (bool, error) { return false, boom }); err != boom {
		t.Errorf("error: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, ok, err := Until(cctx, time.Minute, func() (bool, error) { return false, nil }); ok || err == nil {
		t.Errorf("cancelled: %v %v", ok, err)
	}
}

func TestReady(t *testing.T) {
	pod := func(status corev1.ConditionStatus, deleting bool) corev1.Pod {
		p := corev1.Pod{Status: corev1.PodStatus{Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}, {Type: corev1.PodReady, Status: status}}}}
		if deleting {
			p.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		}
		return p
	}
	if !Ready(pod(corev1.ConditionTrue, false)) || Ready(pod(corev1.ConditionFalse, false)) ||
		Ready(pod(corev1.ConditionTrue, true)) || Ready(corev1.Pod{}) {
		t.Error("ready only with Ready True and not being deleted")
	}
}
