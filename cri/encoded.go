package cri

import (
	"google.golang.org/protobuf/proto"
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
