package sandbox

// CDIDevices lists the CDI devices containers can be given now (for
// verbose Status), sorted.
func (m *Manager) CDIDevices() []string {
	return m.opts.CDI.Devices()
}
