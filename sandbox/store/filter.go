package store

import (
	"errors"

	"github.com/berth-runtime/berth/cri/errkind"
)

// Filter selects pods or containers in a list; its zero fields select
// every one. It is the one filter behind every CRI list call.
type Filter struct {
	// ID and PodID (containers only) are a full ID or a unique prefix of
	// one, as CLI users type them: a prefix of several is errkind.Invalid, one
	// of none selects nothing.
	ID, PodID string
	// State is a runtimeapi.PodSandboxState or ContainerState.
	State *int32
	// Labels must all be present with these values.
	Labels map[string]string
}

// matches reports whether f selects the object with id, labels and state.
// Lists first ask SelectsAll, and read nothing of the objects when it
// holds: a node-wide list walks hundreds, each read a likely cache miss.
func (f Filter) matches(id string, labels map[string]string, state int32) bool {
	return (f.ID == "" || f.ID == id) && (f.State == nil || *f.State == state) && labelsMatch(labels, f.Labels)
}

// SelectsAll reports whether f selects every object.
func (f Filter) SelectsAll() bool {
	return f.ID == "" && f.PodID == "" && f.State == nil && len(f.Labels) == 0
}

// labelsMatch: every selector key must be present with that value (a key
// the object lacks does not match an empty value).
func labelsMatch(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// resolve replaces a prefix with the full ID it names. found is false when
// it names nothing.
func resolve(id *string, find func(string) (string, error)) (found bool, err error) {
	if *id == "" {
		return true, nil
	}
	full, err := find(*id)
	if errors.Is(err, errkind.NotFound) {
		return false, nil
	}
	*id = full
	return err == nil, err
}
