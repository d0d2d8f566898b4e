ô
"serve*2.99.0
.
xPlaceholder*
dtype0*
shape:
.
bConst*
dtype0*
valueB
8
.
eConst*
dtype0*
valueB
8
.
sConst*
dtype0*
valueB
8
K
yStridedSlicexbes*
T0*
Index0*
shrink_axis_mask*Q
serving_default>

x
x:0
y
y:0tensorflow/serving/predict