package cri

import (
	"sync/atomic"

	"google.golang.org/protobuf/proto"

	"github.com/berth-runtime/berth/sandbox/store"
)

// encoded returns a message of msg's type that holds msg's encoding as its
// unknown fields and nothing else. Protobuf writes unknown fields out as
// they are, so the message encodes to the same bytes as msg, and a
// receiver decodes it as msg; encoding it again, in every answer that
// carries it, is a copy rather than a walk of msg's fields, maps and
// submessages. It is for messages made once and sent many times (a stats
// sample goes out in every list until the next one). Read in this process,
// its fields are empty.
func encoded[M proto.Message](msg M) (M, error) {
	b, err := proto.Marshal(msg)
	if err != nil {
		return msg, err
	}
	out := msg.ProtoReflect().New()
	out.SetUnknown(b)
	return out.Interface().(M), nil
}

// kept is a node-wide answer, encoded (see encoded), made of sandbox's
// state at one version of it and sent until the version changes: the
// kubelet, monitoring agents and crictl ask for every container far more
// often than anything in the answer changes, and each call otherwise
// makes and encodes again what the last one did (hundreds of entries,
// garbage the collectors of berthd and of the caller then have to clear).
type kept[M proto.Message] struct{ p atomic.Pointer[keptAnswer[M]] }

type keptAnswer[M proto.Message] struct {
	version uint64
	msg     M
}

// answer is build's answer to a list call with filter f. The node-wide one
// is the answer kept at version, else build's, encoded and kept unless
// build says it must not be (an entry that could not be read, which the
// next call tries again). version is taken before build reads anything, so
// an answer is never older than its version; one made of newer state only
// costs the next call a new one.
func (k *kept[M]) answer(f store.Filter, version uint64, build func() (msg M, keep bool, err error)) (M, error) {
	if !f.SelectsAll() {
		msg, _, err := build()
		return msg, err
	}
	if a := k.p.Load(); a != nil && a.version == version {
		return a.msg, nil
	}
	msg, keep, err := build()
	if err != nil || !keep {
		return msg, err
	}
	if msg, err = encoded(msg); err != nil {
		return msg, err
	}
	k.p.Store(&keptAnswer[M]{version: version, msg: msg})
	return msg, nil
}
