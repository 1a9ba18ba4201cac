package afxdp

// BuildFrame exposes the frame builder to the external namespace tests.
var BuildFrame = buildFrame
