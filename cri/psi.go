package cri

import (
	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/sandbox/stats"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// psiMsgs is a PSI message and the figures it points to.
type psiMsgs struct {
	stats runtimeapi.PsiStats
	data  [2]runtimeapi.PsiData
}

// fill makes p's message; nil where the kernel keeps no PSI (cgroup v1,
// PSI off), as the kubelet reads a nil one as none.
func (m *psiMsgs) fill(p cgroups.Pressure) *runtimeapi.PsiStats {
	if !p.OK {
		return nil
	}
	m.data[0] = runtimeapi.PsiData{Total: p.Some.TotalNanos, Avg10: p.Some.Avg10, Avg60: p.Some.Avg60, Avg300: p.Some.Avg300}
	m.stats = runtimeapi.PsiStats{Some: &m.data[0]}
	if p.HasFull {
		m.data[1] = runtimeapi.PsiData{Total: p.Full.TotalNanos, Avg10: p.Full.Avg10, Avg60: p.Full.Avg60, Avg300: p.Full.Avg300}
		m.stats.Full = &m.data[1]
	}
	return &m.stats
}

// ioMsgs is an I/O usage message, whose only figures in the CRI are PSI.
type ioMsgs struct {
	io  runtimeapi.IoUsage
	psi psiMsgs
}

// fill makes u's I/O message; nil without I/O PSI, the CRI's only I/O
// figures.
func (m *ioMsgs) fill(u stats.Usage) *runtimeapi.IoUsage {
	psi := m.psi.fill(u.PSI.IO)
	if psi == nil {
		return nil
	}
	m.io = runtimeapi.IoUsage{Timestamp: u.Timestamp.UnixNano(), Psi: psi}
	return &m.io
}
