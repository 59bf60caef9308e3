package hbone

import (
	"container/heap"
	"sync"
	"time"
)

// idleClock cuts relays on which nothing moved for their idle time
// (Relay's idle), with one runtime timer for all of them in place of one
// per relay: a timer and the function bound to it were ~130 bytes of
// every idle connection, and a slot in the runtime's timer heap (issue
// 36: memory per idle connection). A relay waits in the slot of the
// moment its idle time runs out, rounded up to its tick (idleTick), in a
// list threaded through the relays themselves; when the moment comes it
// is cut, or moved to the slot of its new end if something moved since.
// So a relay is cut at most a tick late, never early.
type idleClock struct {
	mu    sync.Mutex
	slots map[int64]*relay // the first relay of each moment's slot
	due   dueHeap          // the slots' moments, earliest first (some may be empty)
	timer *time.Timer      // set for due's earliest moment
	at    int64            // when timer fires (0: stopped)
}

var relayIdleClock = &idleClock{slots: make(map[int64]*relay)}

// idleTick is the granularity of a relay's idle check: an eighth of its
// idle time, between 10 ms and 1 s.
func idleTick(idle time.Duration) int64 {
	return int64(min(max(idle/8, 10*time.Millisecond), time.Second))
}

// add starts watching r, last moved at last (unix nanoseconds).
func (k *idleClock) add(r *relay, last int64) {
	k.mu.Lock()
	k.insertLocked(r, last)
	k.mu.Unlock()
}

// remove stops watching r (its relay ended).
func (k *idleClock) remove(r *relay) {
	k.mu.Lock()
	if r.idleAt != 0 {
		k.unlinkLocked(r)
	}
	k.mu.Unlock()
}

func (k *idleClock) insertLocked(r *relay, last int64) {
	tick := idleTick(r.idle)
	at := (last + int64(r.idle) + tick - 1) / tick * tick
	r.idleAt, r.idlePrev = at, nil
	r.idleNext = k.slots[at]
	if r.idleNext != nil {
		r.idleNext.idlePrev = r
	} else {
		heap.Push(&k.due, at)
	}
	k.slots[at] = r
	if k.at == 0 || at < k.at {
		k.at = at
		d := time.Duration(at - time.Now().UnixNano())
		if k.timer == nil {
			k.timer = time.AfterFunc(d, k.fire)
		} else {
			k.timer.Reset(d)
		}
	}
}

func (k *idleClock) unlinkLocked(r *relay) {
	if r.idlePrev != nil {
		r.idlePrev.idleNext = r.idleNext
	} else if r.idleNext != nil {
		k.slots[r.idleAt] = r.idleNext
	} else {
		delete(k.slots, r.idleAt) // its moment stays in due, found empty
	}
	if r.idleNext != nil {
		r.idleNext.idlePrev = r.idlePrev
	}
	r.idleAt, r.idleNext, r.idlePrev = 0, nil, nil
}

// fire checks the relays of every slot whose moment has come.
func (k *idleClock) fire() {
	var idle []*relay
	k.mu.Lock()
	now := time.Now().UnixNano()
	for k.due.Len() > 0 && k.due[0] <= now {
		at := heap.Pop(&k.due).(int64)
		r := k.slots[at]
		delete(k.slots, at)
		for r != nil {
			next := r.idleNext
			r.idleAt, r.idleNext, r.idlePrev = 0, nil, nil
			if last := r.last.Load(); now-last >= int64(r.idle) {
				idle = append(idle, r)
			} else {
				k.insertLocked(r, last)
			}
			r = next
		}
	}
	k.at = 0
	if k.due.Len() > 0 {
		k.at = k.due[0]
		k.timer.Reset(time.Duration(k.at - now))
	}
	k.mu.Unlock()
	for _, r := range idle {
		r.abort(idleError(time.Duration(now - r.last.Load())))
	}
}

// dueHeap is a min-heap of moments (container/heap).
type dueHeap []int64

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(int64)) }
func (h *dueHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
